"""Compute's Spark network flags: the driver's address and its ports become the session's
settings, so that a NetworkPolicy between the driver and its executors can allow exactly those
ports; left unset, Spark's defaults (ephemeral ports) stay."""

from __future__ import annotations

import pytest

from services.compute.__main__ import ComputeConfig
from services.compute.spark.session import MESH_PORTS, RESIDENT_PORT, port_range
from tidemark.config import load_config


def test_port_flags_become_spark_settings() -> None:
    config = load_config(
        ComputeConfig,
        [
            *("--spark-master", "spark://master:7077"),
            *("--spark-driver-host", "10.0.0.7"),
            *("--spark-bind-address", "0.0.0.0"),
            *("--spark-driver-port", "7078"),
            *("--spark-block-manager-port", "7079"),
            *("--spark-resident-port", "7080"),
            *("--spark-mesh-ports", "7081-7096"),
            *("--spark-executor-memory", "2g"),
        ],
        {},
    )
    assert config.spark_settings() == {
        "spark.driver.memory": "1g",
        "spark.executor.memory": "2g",
        "spark.driver.host": "10.0.0.7",
        "spark.driver.bindAddress": "0.0.0.0",
        "spark.driver.port": "7078",
        "spark.blockManager.port": "7079",
        RESIDENT_PORT: "7080",
        MESH_PORTS: "7081-7096",
    }


def test_the_environment_sets_them_as_a_deployment_does() -> None:
    config = load_config(
        ComputeConfig,
        [],
        {"TIDEMARK_SPARK_DRIVER_HOST": "10.0.0.8", "TIDEMARK_SPARK_RESIDENT_PORT": "7080"},
    )
    settings = config.spark_settings()
    assert settings["spark.driver.host"] == "10.0.0.8"
    assert settings[RESIDENT_PORT] == "7080"
    assert "spark.driver.port" not in settings


def test_unset_flags_leave_spark_its_ephemeral_ports() -> None:
    settings = load_config(ComputeConfig, [], {}).spark_settings()
    assert settings == {"spark.driver.memory": "1g", "spark.executor.memory": "1g"}


def test_a_mesh_port_range_is_checked() -> None:
    assert port_range("7081-7096") == (7081, 7096)
    assert port_range("7081") == (7081, 7081)
    for text in ("7096-7081", "0-10", "7081-70000", "ports"):
        with pytest.raises(ValueError):
            port_range(text)
