"""Moving updates to the shard that owns their key.

Before a stateful operator, each input's updates are split by ``shard_of(route(row), P)``
wherever they currently are; after the exchange, shard ``p`` holds every update whose key it
owns, so its arrangement sees the whole history of those keys and nothing else. Linear
operators need no exchange: they run on whatever part of the data a shard holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.compute.dataflow.batch import Key, KeyFunction, Update
from services.compute.dataflow.keys import shard_of


def partition(updates: Sequence[Update], route: KeyFunction, shards: int) -> list[list[Update]]:
    """``updates`` split into one list per shard, by the shard that owns each row's key.

    Each of ``route``'s key columns must hold values of one Python class (as rows decoded
    from their schema do): ``shard_of`` hashes ``1``, ``1.0`` and ``True`` apart although
    Python finds them equal, so a column mixing them would be split across shards anyway,
    and here equal keys share the first one's shard."""
    parts: list[list[Update]] = [[] for _ in range(shards)]
    if shards == 1:
        parts[0].extend(updates)
        return parts
    # A step's updates repeat keys (a retraction and an insertion of one row, many rows of
    # one group), and hashing a key is most of the cost of routing it.
    owners: dict[Key, int] = {}
    for update in updates:
        key = route(update[0])
        owner = owners.get(key)
        if owner is None:
            owner = owners[key] = shard_of(key, shards)
        parts[owner].append(update)
    return parts


def exchange(
    held: Sequence[Sequence[Update]], route: KeyFunction, shards: int
) -> list[list[Update]]:
    """Every shard's ``held`` updates re-partitioned by key: entry ``p`` of the result is what
    shard ``p`` receives."""
    received: list[list[Update]] = [[] for _ in range(shards)]
    for updates in held:
        for target, part in enumerate(partition(updates, route, shards)):
            received[target].extend(part)
    return received
