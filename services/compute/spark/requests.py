"""What the driver asks a resident task to do, and what the task answers.

Every request gets exactly one ``Reply``; a request that fails inside the task is answered
with the error (the task keeps serving), while a task that dies closes its socket. Besides
them, the two liveness frames ``Ping`` (driver to task) and ``Heartbeat`` (task to driver)
flow both ways unanswered (``liveness.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.compute.dataflow.batch import Update


@dataclass(frozen=True)
class Install:
    """Lower ``plan`` (serialized ``Plan``, or ``Relation`` when ``is_relation``) and keep an
    empty shard of its operator state under ``dataflow_id``; with ``index_key_columns``, also
    keep this shard's part of an index over the output, readable from ``index_since``."""

    dataflow_id: str
    plan: bytes
    is_relation: bool = False
    index_key_columns: tuple[int, ...] | None = None
    index_since: int = 0


@dataclass(frozen=True)
class Drop:
    dataflow_id: str


@dataclass(frozen=True)
class Step:
    """Run one step of the dataflow on this task's share of its source updates
    (``sources[node_id]``, any split of the step's input: only the exchange before each
    stateful node puts updates where their keys live), exchanging updates with the other
    tasks over the mesh (``mesh.py``). ``constants_at``: the time the constant relations
    appear at (a hydration; shard 0 emits them), else None. With an index, the output is
    routed to the shards owning its keys and applied with ``index_upper``. The reply is this
    task's share of the step's output."""

    dataflow_id: str
    sources: dict[int, list[Update]]
    constants_at: int | None
    index_upper: int
    io: StepIO | None = None
    """With it, the task also reads input parts and writes its output share as a part."""


@dataclass(frozen=True)
class StepIO:
    """A step's ends in storage, for a task that reads and writes them itself
    (``step_io.py``). ``parts[node_id]``: the parts of that source's collection this task
    reads, each as ``(key, lower, upper, slice, slices)``: only its updates at times in
    ``[lower, upper)`` count (a part may hold others), and of those only the ``slice``-th of
    ``slices`` equal runs of rows (a part dealt to several tasks; ``0, 1``: all of them;
    ``0, 0``: every task reads all of it and keeps the rows of its key partition, for a
    source in ``part_shares.keyed_sources``).
    ``output_collection``: where the task writes its share
    of the output as one Parquet part (``""``: it answers with the updates instead);
    ``output_schema`` is that collection's serialized ``RelationSchema``; ``return_rows``:
    also answer with the updates. Parts live in the blob store at ``blob_url``, opened with
    the S3 credentials in ``environment``. The reply is a ``StepWritten``."""

    blob_url: str
    environment: dict[str, str]
    parts: dict[int, list[tuple[str, int, int, int, int]]]
    output_collection: str
    output_schema: bytes
    return_rows: bool


@dataclass(frozen=True)
class StepWritten:
    """A task's answer to a ``Step`` with ``StepIO`` writing the output: its part ``(key,
    rows, bytes)`` (None: its share was empty), the least and greatest time in it, the sum of
    its diffs, and its updates when asked for (else None). Shares are disjoint by row."""

    part: tuple[str, int, int] | None
    least: int
    greatest: int
    diffs: int
    updates: list[Update] | None


@dataclass(frozen=True)
class MeshAddress:
    """Where this task's mesh listener is (the reply is ``(host, port)``)."""


@dataclass(frozen=True)
class JoinMesh:
    """Connect to every other task (``addresses[p]`` is shard ``p``'s listener). With
    ``rejoin``, this task replaces a lost one in a running mesh (``mesh.py``), and the
    ``Step`` requests the lost task had been sent number ``steps``: the next one is
    ``steps + 1`` on every task."""

    addresses: tuple[tuple[str, int], ...]
    rejoin: bool = False
    steps: int = 0


@dataclass(frozen=True)
class MeshPeer:
    """Task to task, once, right after the hello of a task that replaces a lost one: where
    its mesh listener is, so that the peer dials it back."""

    host: str
    port: int


@dataclass(frozen=True)
class Exchange:
    """Task to task, within step number ``step`` (every task counts the ``Step`` requests
    it gets; they all get the same ones): the sender's part of stateful node ``node_id``'s
    inputs that the receiver's keys own (one list per input), or, with ``failed``, word that
    the sender's step failed and sends nothing more for it. Exactly one per peer per
    exchange, even empty, so a receiver knows when it has everything."""

    step: int
    node_id: int
    inputs: tuple[list[Update], ...]
    failed: bool = False


@dataclass(frozen=True)
class ApplyIndex:
    """Add this shard's part of a step's output (updates before ``upper``) to its index."""

    dataflow_id: str
    updates: list[Update]
    upper: int


@dataclass(frozen=True)
class CompactIndex:
    """Allow reads of this shard's index only at ``since`` and later, folding its older
    history into the consolidated base (``Index.compact``)."""

    dataflow_id: str
    since: int


@dataclass(frozen=True)
class Peek:
    """This shard's part of the output's contents at ``time``."""

    dataflow_id: str
    time: int


@dataclass(frozen=True)
class IndexChanges:
    """This shard's part of the output's changes at times in ``[lower, upper)``, from its
    index's history (``Index.changes_between``): the rows of steps that stayed on the
    tasks, for a subscriber that came after them."""

    dataflow_id: str
    lower: int
    upper: int


@dataclass(frozen=True)
class Stats:
    """Keys held, work done, entries held and their estimated bytes, by this shard of a
    dataflow (the reply is ``(keys, Work, rows, bytes)``)."""

    dataflow_id: str


@dataclass(frozen=True)
class PartsShare:
    """An input a task reads straight from a collection's parts (``part_shares.py``): the
    parts ``keys`` in the blob store at ``blob_url``, of which the task keeps the updates at
    times ``<= as_of``, the ``columns`` named (in order, a name may repeat: the input is a
    projection of the collection) and the rows whose key its shard owns."""

    blob_url: str
    keys: tuple[str, ...]
    columns: tuple[str, ...]
    later_times: bool = True
    """Whether a part may hold updates after ``as_of`` (a compacted one): only then are
    times read and filtered."""


@dataclass(frozen=True)
class Hydrate:
    """Build this shard's state of a hydrating dataflow from what a Spark job staged in the
    blob store at ``blob_url`` (``hydration.py``): ``nodes[node_id]`` names, per input of
    that stateful node, the objects holding its rows at ``as_of`` (none: no rows);
    ``index`` the objects of the output, for the index. Where the input's key is plain
    columns (``part_shares.route_columns``; always for the index) the objects hold every
    shard's rows and the task keeps its own; otherwise they hold this shard's alone.
    ``shares[node_id]``: per input of that node, the parts the task reads that input from
    itself instead (``None``: the staged objects, if any, hold it). ``states``: the
    Reduce nodes whose staged objects hold their groups' partial aggregates
    (``ReduceState.load_group_states``), keyed by their first columns, rather than their
    input rows. ``environment``: the S3 credentials to open the stores with.
    ``complete``: false when a later ``Hydrate`` brings the rest of the state (the nodes
    read from parts alone load while Spark's jobs run); the index is loaded with the last.
    The task answers ``(updates loaded, sum of the diffs loaded into the index)``."""

    dataflow_id: str
    blob_url: str
    environment: dict[str, str]
    as_of: int
    nodes: dict[int, tuple[tuple[str, ...], ...]]
    index: tuple[str, ...]
    shares: dict[int, tuple[PartsShare | None, ...]] = field(default_factory=dict)
    states: tuple[int, ...] = ()
    complete: bool = True


@dataclass(frozen=True)
class LoadRows:
    """Build this shard's state of an installed dataflow from rows the driver computed (a
    plan of constants, whose rows the driver knows: no Spark job stages them):
    ``nodes[node_id]`` holds, per input of that stateful node, the updates its key routes to
    this shard, and ``index`` this shard's part of the output, added to the index with
    ``index_upper``. The task answers the number of updates loaded."""

    dataflow_id: str
    nodes: dict[int, tuple[list[Update], ...]]
    index: list[Update]
    index_upper: int


@dataclass(frozen=True)
class Stop:
    """Finish the task (its Spark slot is freed once every task of the job has finished)."""


@dataclass(frozen=True)
class Ping:
    """The driver is alive (sent every heartbeat interval; never answered). A task that
    receives no frame at all for the deadline gives its driver up and ends."""


@dataclass(frozen=True)
class Heartbeat:
    """The task is alive (sent every heartbeat interval from a thread of its own, also while
    a request runs; never answered). The driver gives up a task silent for the deadline."""


Request = (
    Install
    | Drop
    | Step
    | MeshAddress
    | JoinMesh
    | Hydrate
    | LoadRows
    | ApplyIndex
    | CompactIndex
    | Peek
    | IndexChanges
    | Stats
    | Stop
)


@dataclass(frozen=True)
class Reply:
    value: Any = None
    error_class: str | None = None
    error_message: str = ""
