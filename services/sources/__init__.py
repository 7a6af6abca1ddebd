"""The sources process: runs one ingestion per source the catalog holds (load generators,
PostgreSQL), exactly once across restarts (``tidemark/sources/ingest.py``)."""
