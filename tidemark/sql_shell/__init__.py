"""``tidemark sql``: a psql-like shell over the adapter's gRPC API."""
