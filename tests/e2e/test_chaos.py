"""The chaos suite at reduced size (``make chaos`` runs it longer, see bench/chaos.py): the
workload of tests/support/chaos.py through two adapters on a 3-member etcd cluster and the S3
endpoint while processes are kill -9'd and restarted, then the checks — nothing acknowledged
lost or doubled, the bank total at every sampled time, views equal to their recomputation,
SUBSCRIBE equal to AS OF reads, no serializability anomaly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.chaos import Config, check_run, report, run_workload
from tests.support.chaos_cluster import S3_ENV, chaos_cluster

pytestmark = [pytest.mark.etcd, pytest.mark.s3, pytest.mark.slow]

# KNOWN BUG, excluded here until the durable read holds of issue 19 item 1 are merged: after
# storage restarts, a materialized view's since runs away once the leased read holds expire,
# and the view cannot be read again (42P01 "collection u2 can no longer be read"). `make chaos`
# keeps the storage fault and reports the finding. Re-enable by adding "storage" below.
REDUCED_FAULTS = ("oracle", "catalog", "compute", "adapter", "etcd", "s3")


@pytest.mark.timeout(240)
async def test_chaos_reduced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
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
