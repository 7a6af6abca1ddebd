"""pytest fixtures: a real s3 server for the integration tests (filled in with the backends)."""
