"""Consensus: a linearizable, versioned key-value store with compare-and-set.

Pick a backend with :func:`open_consensus` (``etcd://``, ``sqlite://`` or ``memory://``);
every backend honours the contract in :mod:`tidemark.consensus.base`.
"""

from tidemark.consensus.base import (
    DEFAULT_MAX_VALUE_BYTES,
    MAX_KEY_BYTES,
    CasResult,
    Committed,
    Consensus,
    Mismatch,
    VersionedData,
)
from tidemark.consensus.urls import open_consensus

__all__ = [
    "DEFAULT_MAX_VALUE_BYTES",
    "MAX_KEY_BYTES",
    "CasResult",
    "Committed",
    "Consensus",
    "Mismatch",
    "VersionedData",
    "open_consensus",
]
