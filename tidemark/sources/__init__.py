"""Sources: ingestion of external data into storage collections, exactly once.

- :mod:`tidemark.sources.reader`: the interface every kind of source implements
  (:class:`~tidemark.sources.reader.SourceReader`);
- :mod:`tidemark.sources.ingest`: the ingestion loop that binds a reader's offsets to data
  times in a progress collection and appends each batch once, whatever crashes;
- :mod:`tidemark.sources.progress`: the progress relation's schema and rows;
- :mod:`tidemark.sources.plan`: what the catalog says a source ingests into;
- :mod:`tidemark.sources.loadgen`: the load generators (COUNTER, AUCTION, TPCH);
- :mod:`tidemark.sources.postgres`: PostgreSQL logical replication (``pgoutput``).
"""
