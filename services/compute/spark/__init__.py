"""The Spark runtime of the dataflow engine (design option D, ``../DESIGN-NOTES.md``).

``spark_session`` gives the process its one SparkSession; ``ResidentCluster`` runs P
long-lived tasks that each hold one shard of the operator state; ``SparkDataflow``
maintains a plan on such a cluster with the in-process ``Dataflow``'s contract.
"""

from services.compute.spark.resident import ResidentCluster
from services.compute.spark.session import spark_session, stop_spark_session
from services.compute.spark.spark_dataflow import SparkDataflow

__all__ = ["ResidentCluster", "SparkDataflow", "spark_session", "stop_spark_session"]
