"""The open transaction of a session, and its bytes in ``Session.transaction``.

The adapter is stateless, so an open transaction travels with the client: any adapter can run
the next statement or the ``COMMIT``. What it records:

- ``read_ts``: the data time every read of the transaction happens at (fixed by the first
  read), and the tables and sources those reads depended on;
- ``write``: the writes so far, buffered (never appended before ``COMMIT``), all to one table;
- ``failed``: a statement failed, so everything but ``ROLLBACK`` (or ``COMMIT``, which then
  rolls back) is refused.

The rules (seed 000, Transactions): a read-only transaction reads at one time; a write-only
one applies its writes at commit at one time; a read-then-write one reads at ``r`` and writes
at a later ``w``, valid only if nothing it read changed in between (else 40001). Reads after
writes, and writes to more than one table, are not supported (0A000), so a commit is always a
single append: it lands whole or not at all.

Wire form: ``TMTX`` + a 4-byte big-endian header length + a JSON header + the buffered rows as
an Arrow IPC stream (the table's columns, ``time`` unused, ``diff``).
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass, field
from typing import Any

from services.adapter.sql.errors import SqlError
from tidemark.columnar import RelationSchema, Row, from_ipc, table_from_updates, to_ipc
from tidemark.columnar.rows import updates_from_table
from tidemark.errors import InvalidArgument
from tidemark.v1 import common_pb2

MAGIC = b"TMTX"
VERSION = 1
NOT_SUPPORTED = "0A000"


@dataclass
class BufferedWrite:
    """Rows to add (positive diff) and remove (negative) in one table at commit."""

    table_id: str
    table_name: str
    schema: RelationSchema
    rows: list[tuple[Row, int]] = field(default_factory=list)

    def consolidated(self) -> list[tuple[Row, int]]:
        totals: dict[Row, int] = {}
        for row, diff in self.rows:
            totals[row] = totals.get(row, 0) + diff
        return [(row, diff) for row, diff in totals.items() if diff != 0]


@dataclass
class Transaction:
    """An explicit transaction (``BEGIN`` ... ``COMMIT``)."""

    read_ts: int | None = None
    reads: set[str] = field(default_factory=set)
    """Tables the reads depended on."""
    read_sources: set[str] = field(default_factory=set)
    """Sources the reads depended on."""
    write: BufferedWrite | None = None
    failed: bool = False
    read_only: bool = False

    @property
    def has_reads(self) -> bool:
        return self.read_ts is not None

    def check_can_read(self, position: int = 0) -> None:
        if self.write is not None:
            raise SqlError(
                NOT_SUPPORTED,
                "reading after writing in the same transaction is not supported",
                position,
                hint="commit the writes first, or read before writing",
            )

    def add_write(
        self,
        table_id: str,
        table_name: str,
        schema: RelationSchema,
        rows: list[tuple[Row, int]],
        position: int = 0,
    ) -> None:
        if self.read_only:
            raise SqlError("25006", "cannot write in a read-only transaction", position)
        if self.write is None:
            self.write = BufferedWrite(table_id, table_name, schema)
        elif self.write.table_id != table_id:
            raise SqlError(
                NOT_SUPPORTED,
                f"writing to more than one table in a transaction is not supported (it "
                f"already writes {self.write.table_name}; this statement writes {table_name})",
                position,
                hint="commit each table's writes in its own transaction",
            )
        self.write.rows.extend(rows)

    # -- the wire form --------------------------------------------------------------------

    def encode(self) -> bytes:
        header: dict[str, Any] = {
            "v": VERSION,
            "read_ts": self.read_ts,
            "reads": sorted(self.reads),
            "read_sources": sorted(self.read_sources),
            "failed": self.failed,
            "read_only": self.read_only,
        }
        body = b""
        if self.write is not None:
            header["write"] = {
                "table_id": self.write.table_id,
                "table_name": self.write.table_name,
                "schema": base64.b64encode(
                    self.write.schema.to_proto().SerializeToString()
                ).decode(),
            }
            updates = [(row, 0, diff) for row, diff in self.write.consolidated()]
            body = to_ipc(table_from_updates(self.write.schema, updates))
        encoded = json.dumps(header, separators=(",", ":")).encode()
        return MAGIC + struct.pack(">I", len(encoded)) + encoded + body

    @classmethod
    def decode(cls, data: bytes) -> Transaction:
        """The transaction ``data`` holds; ``InvalidArgument`` for anything malformed."""
        try:
            if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
                raise ValueError("not a transaction")
            (length,) = struct.unpack(">I", data[len(MAGIC) : len(MAGIC) + 4])
            start = len(MAGIC) + 4
            header = json.loads(data[start : start + length])
            if header.get("v") != VERSION:
                raise ValueError(f"unknown version {header.get('v')!r}")
            read_ts = header.get("read_ts")
            if read_ts is not None and (not isinstance(read_ts, int) or read_ts < 0):
                raise ValueError("bad read timestamp")
            transaction = cls(
                read_ts=read_ts,
                reads={str(r) for r in header.get("reads", [])},
                read_sources={str(r) for r in header.get("read_sources", [])},
                failed=bool(header.get("failed", False)),
                read_only=bool(header.get("read_only", False)),
            )
            written = header.get("write")
            if written is not None:
                schema = RelationSchema.from_proto(
                    common_pb2.RelationSchema.FromString(base64.b64decode(written["schema"]))
                )
                table = from_ipc(data[start + length :])
                rows = [(row, diff) for row, _, diff in updates_from_table(table)]
                transaction.write = BufferedWrite(
                    str(written["table_id"]), str(written["table_name"]), schema, rows
                )
            return transaction
        except InvalidArgument as exc:
            raise InvalidArgument(f"malformed session transaction: {exc.message}") from None
        except Exception as exc:
            raise InvalidArgument(f"malformed session transaction: {exc}") from None
