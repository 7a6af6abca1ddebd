"""Storage, the persist layer: durable time-varying collections (``python -m services.storage``).

Layout, from the bottom up:

- ``state``: a shard's durable state as immutable values, and its protobuf encoding;
- ``operations``: the rules (capabilities, appends, leases, batch swaps) as pure functions
  from one state to the next;
- ``shards``: states in consensus, changed by compare-and-set with group commit;
- ``batches``: Parquet blobs under never-reused keys, with a cache of decoded tables;
- ``reads``: snapshots and time ranges read from one consistent set of batches;
- ``watch``: pushing state changes to local subscribers; ``subscriptions``: SubscribeAt and
  SubscribeParts; ``joint_parts``: SubscribePartsJointly, several inputs' parts moving with
  their meet;
- ``shaping``: column projection and row filters;
- ``compaction``, ``garbage``, ``maintenance``: the background work;
- ``core``: every API call in Python terms; ``service``: its gRPC face; ``__main__``: the
  process.
"""
