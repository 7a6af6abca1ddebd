"""One Spark session for the whole test run (starting one costs seconds), and one resident
cluster of two shards shared by the tests that only install dataflows on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from services.compute.spark import ResidentCluster, spark_session, stop_spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session(min_slots=6)
    yield session
    stop_spark_session()


@pytest.fixture(scope="session")
def cluster(spark: SparkSession) -> Iterator[ResidentCluster]:
    with ResidentCluster(spark, 2) as resident:
        yield resident
