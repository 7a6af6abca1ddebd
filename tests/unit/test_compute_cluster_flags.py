"""Compute's resident-cluster flags reach the engine that starts and watches the tasks."""

from __future__ import annotations

import pytest

from services.compute.__main__ import ComputeConfig
from services.compute.engines import SparkEngine
from services.compute.spark.liveness import ClusterStart, Liveness
from tidemark.config import load_config
from tidemark.errors import InvalidArgument


def test_liveness_and_start_flags_become_the_engines_cluster_start() -> None:
    config = load_config(
        ComputeConfig,
        [
            "--task-heartbeat",
            "0.5",
            "--task-deadline",
            "4",
            "--cluster-start-timeout",
            "30",
            "--cluster-start-attempts",
            "5",
        ],
        {},
    )
    engine = config.make_engine()
    assert isinstance(engine, SparkEngine)
    assert engine.start_settings == ClusterStart(Liveness(0.5, 4.0), 30.0, 5)


def test_the_defaults_are_the_documented_ones() -> None:
    engine = load_config(ComputeConfig, [], {}).make_engine()
    assert isinstance(engine, SparkEngine)
    assert engine.start_settings == ClusterStart(Liveness(2.0, 15.0), 120.0, 3)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--task-heartbeat", "5", "--task-deadline", "6"], "at least two heartbeats"),
        (["--task-heartbeat", "0"], "heartbeat interval must be positive"),
        (["--cluster-start-attempts", "0"], "at least one attempt"),
        (["--cluster-start-timeout", "-1"], "positive timeout"),
    ],
)
def test_settings_that_cannot_work_are_refused_with_the_reason(
    flags: list[str], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        load_config(ComputeConfig, flags, {}).make_engine()
