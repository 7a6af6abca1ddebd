"""The adapter: SQL sessions over the oracle, catalog, storage and compute services.

Stateless (a session travels with the client), so any number run side by side. The parts:
``catalog_cache`` (a local copy of the catalog), ``timestamps`` (oracle times and table
uppers), ``holds`` (storage capabilities), ``ddl``/``ddl_statements`` (catalog changes),
``reads``/``index_match`` (queries on compute), ``writes``/``dml``/``transactions``,
``subscribe``, ``show``, ``results``/``finishing`` (what the client gets), ``executor``
(statement dispatch) and ``service`` (the gRPC face). SQL itself is parsed and planned in
``sql``.
"""
