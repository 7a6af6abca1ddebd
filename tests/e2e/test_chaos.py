"""The chaos suite at reduced size (``make chaos`` runs it longer, see bench/chaos.py): the
workload of tests/support/chaos.py through two adapters on a 3-member etcd cluster and the S3
endpoint while processes are kill -9'd and restarted, then the checks — nothing acknowledged
lost or doubled, the bank total at every sampled time, views equal to their recomputation,
SUBSCRIBE equal to AS OF reads, no serializability anomaly.

A materialized view outlives the adapter that created it: its output collection carries the
catalog's durable read hold, so killing that adapter past its lease loses nothing
(test_a_view_outlives_the_adapter_that_created_it).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.support.chaos import Config, check_run, report, run_workload
from tests.support.chaos_cluster import S3_ENV, chaos_cluster
from tidemark.clients.adapter import AdapterClient

pytestmark = [pytest.mark.etcd, pytest.mark.s3, pytest.mark.slow]

REDUCED_FAULTS = ("oracle", "catalog", "storage", "compute", "adapter", "etcd", "s3")
LEASE_SECONDS = 30  # the storage lease the chaos cluster runs with (FAST_SETTINGS)


@pytest.fixture(autouse=True)
def s3_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)


@pytest.mark.timeout(240)
async def test_chaos_reduced(tmp_path: Path) -> None:
    config = Config(seconds=35.0, fault_interval=2.5, faults=REDUCED_FAULTS, sampled_times=10)
    with chaos_cluster(tmp_path) as cluster:
        record = await run_workload(cluster, config)
        findings = await check_run(cluster.adapters, record, config)
    result = report(config, record, findings, config.seconds)
    print(json.dumps({k: v for k, v in result.items() if k != "fault_log"}, indent=1))
    assert sum(result["faults_injected"].values()) >= 5, result["faults_injected"]
    assert result["operations"]["insert"].get("ok", 0) > 0
    assert result["operations"]["transfer"].get("ok", 0) > 0
    assert result["operations"]["list_append"].get("ok", 0) > 0
    assert result["checked"]["subscribe_segments"] > 0
    assert result["anomalies"] == []


@pytest.mark.timeout(180)
async def test_a_view_outlives_the_adapter_that_created_it(tmp_path: Path) -> None:
    with chaos_cluster(tmp_path, backends="embedded") as cluster:
        async with AdapterClient(cluster.adapters[0]) as creator:
            created = await creator.execute(
                "CREATE TABLE t (x bigint); INSERT INTO t VALUES (1), (2);"
                "CREATE MATERIALIZED VIEW v AS SELECT sum(x) AS s FROM t"
            )
            assert created.error is None, created.error
        await asyncio.to_thread(cluster.kill, "adapter0")
        await asyncio.to_thread(cluster.restart, "adapter0")
        # Past the lease, and past the storage maintenance pass that drops expired holds.
        await asyncio.sleep(LEASE_SECONDS + 20)
        async with AdapterClient(cluster.adapters[1]) as reader:
            read = await reader.execute("SELECT s FROM v")
        assert read.error is None, f"{read.error.code}: {read.error.message}"
        assert read.results[-1].rows == [(3,)]
