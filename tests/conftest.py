"""Shared pytest configuration."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# Real servers started on free ports, one per test session.
pytest_plugins = ["tests.support.etcd", "tests.support.s3", "tests.support.postgres"]

# CI runs more examples than a developer's inner loop does by default.
settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")
