"""pytest fixtures: a real etcd server for the integration tests (filled in with the backends)."""
