"""The dataflow's operators.

Linear operators (filter, map, project, union, negate) transform update triples one by one
and keep no state. Stateful operators (join, reduce, distinct, threshold, top-k) keep
arrangements: their state indexed by key, so a batch costs work in proportion to the keys it
touches. Each stateful operator is split into an immutable description (``...Operator``),
which says how to route rows to shards, and per-shard state (``...State``), which does the work.
"""
