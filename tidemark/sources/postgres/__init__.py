"""PostgreSQL change-data-capture: logical replication with ``pgoutput`` into Tidemark
collections, one per upstream table."""
