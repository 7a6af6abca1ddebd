"""Chaos run: ``make chaos`` or ``.venv/bin/python bench/chaos.py [--seconds N]``.

Starts Tidemark on a 3-member etcd cluster and the S3 endpoint (tests/support/chaos_cluster.py),
runs the workload of tests/support/chaos.py through both adapters while a random process is
kill -9'd every few seconds and restarted, then checks the history. Prints the report and
writes ``bench/results/chaos.json``; exits 1 when an anomaly was found.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # for tests.support when run as a script

from tests.support.chaos import Config, check_run, report, run_workload  # noqa: E402
from tests.support.chaos_cluster import S3_ENV, chaos_cluster  # noqa: E402
from tidemark.logging import configure_logging  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "chaos.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=180.0, help="how long faults go on")
    parser.add_argument("--fault-interval", type=float, default=4.0)
    parser.add_argument("--engine", default="local", help="compute engine: local or spark")
    parser.add_argument(
        "--backends",
        default="production",
        choices=["production", "embedded"],
        help="3-member etcd + the S3 endpoint, or SQLite files + a local blob directory",
    )
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument(
        "--faults",
        default=",".join(Config.faults),
        help="comma-separated kinds: oracle,catalog,storage,compute,adapter,etcd,s3",
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    options = parser.parse_args()
    config = Config(
        seconds=options.seconds,
        fault_interval=options.fault_interval,
        faults=tuple(options.faults.split(",")),
        seed=options.seed,
    )
    os.environ.update(S3_ENV)
    configure_logging(level="warning")  # the clients' retries are expected here, not news
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tidemark-chaos-") as directory:
        with chaos_cluster(
            Path(directory), engine=options.engine, backends=options.backends
        ) as cluster:
            record = asyncio.run(run_workload(cluster, config))
            findings = asyncio.run(check_run(cluster.adapters, record, config))
    result = report(config, record, findings, time.monotonic() - started)
    text = json.dumps(result, indent=2, default=str)
    print(text)
    options.output.parent.mkdir(parents=True, exist_ok=True)
    options.output.write_text(text + "\n")
    return 1 if result["anomalies"] else 0


if __name__ == "__main__":
    sys.exit(main())
