"""What running one statement gives the wire front end to send."""

from __future__ import annotations

from dataclasses import dataclass, field

from tidemark.v1 import adapter_pb2


@dataclass
class Result:
    """A statement's outcome as the client sees it (``columns`` None: it returns no rows)."""

    tag: str
    columns: list[adapter_pb2.SqlColumn] | None = None
    rows: list[adapter_pb2.SqlRow] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    empty: bool = False
