"""A small Elle-style checker for list-append histories: it infers the dependencies between
transactions from what they read and appended, and reports serializability anomalies as cycles.

The model (Elle's "list-append"): every key holds a list; a transaction appends values to
keys and reads whole lists. Every appended value is unique per key, so a read names exactly the
writes it saw, and the longest read of a key gives that key's version order (every other read
must be a prefix of it). From that:

- ``ww``: the writer of the i-th element precedes the writer of the (i+1)-th;
- ``wr``: the writer of a read's last element precedes the reader;
- ``rw``: a reader of a prefix ending at element i precedes the writer of element i+1 (an
  anti-dependency: the reader did not see that write);
- ``rt`` (optional, for strict serializability): a transaction that completed before another
  began precedes it.

Cycles are classified as in Adya's hierarchy, as Elle does: ``G0`` (ww only), ``G1c`` (ww and
wr), ``G-single`` (exactly one rw), ``G2`` (more than one rw); a cycle that needs an ``rt`` edge
gets the suffix ``-realtime``. Non-cycle anomalies: ``G1a`` (a read saw a failed
transaction's append), ``G1b`` (a read ended at a value its writer later overwrote within the
same transaction's appends to that key), ``duplicate-elements`` and ``incompatible-order``
(two reads of one key that are not prefixes of each other).

Transactions whose outcome is unknown (``info``: the connection was lost) may or may not have
committed: their appends are allowed in reads, and they take part in the graph only when some
read shows they committed.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

Outcome = Literal["ok", "fail", "info"]
EdgeKind = Literal["ww", "wr", "rw", "rt"]


@dataclass(frozen=True)
class Append:
    key: Hashable
    value: Hashable


@dataclass(frozen=True)
class Read:
    key: Hashable
    values: tuple[Hashable, ...]


MicroOp = Append | Read


@dataclass(frozen=True)
class Transaction:
    """One transaction as the client saw it: its micro-operations in order, its outcome, and
    (for the real-time order) when it was invoked and when it completed, on one clock."""

    id: int
    ops: tuple[MicroOp, ...]
    outcome: Outcome = "ok"
    invoked: float | None = None
    completed: float | None = None


@dataclass(frozen=True)
class Anomaly:
    kind: str
    transactions: tuple[int, ...]
    explanation: str


@dataclass
class CheckResult:
    anomalies: list[Anomaly] = field(default_factory=list)
    transactions: int = 0
    edges: int = 0

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def kinds(self) -> set[str]:
        return {a.kind for a in self.anomalies}


def check(history: Iterable[Transaction], *, realtime: bool = False) -> CheckResult:
    """The anomalies of ``history`` (empty when it is serializable; strictly serializable
    too when ``realtime``)."""
    txns = list(history)
    result = CheckResult(transactions=len(txns))
    by_id = {t.id: t for t in txns}
    writer: dict[tuple[Hashable, Hashable], int] = {}
    for t in txns:
        for op in t.ops:
            if isinstance(op, Append):
                if (op.key, op.value) in writer:
                    raise ValueError(f"value {op.value!r} appended twice to key {op.key!r}")
                writer[(op.key, op.value)] = t.id

    orders = _version_orders(txns, result)
    _aborted_and_intermediate_reads(txns, by_id, writer, result)

    committed = {t.id for t in txns if t.outcome == "ok"}
    for key, order in orders.items():  # an unknown outcome that was read did commit
        committed.update(writer[(key, v)] for v in order if (key, v) in writer)
    committed -= {t.id for t in txns if t.outcome == "fail"}

    graph = _dependencies(txns, orders, writer, committed)
    if realtime:
        _realtime_edges(txns, committed, graph)
    result.edges = sum(len(kinds) for targets in graph.values() for kinds in targets.values())
    result.anomalies.extend(_cycles(graph))
    return result


def _version_orders(txns: Sequence[Transaction], result: CheckResult) -> dict[Hashable, tuple]:
    """Per key, the longest list any transaction read; every read must be a prefix of it."""
    reads: dict[Hashable, list[tuple[int, tuple[Hashable, ...]]]] = defaultdict(list)
    for t in txns:
        if t.outcome == "fail":
            continue
        for op in t.ops:
            if isinstance(op, Read):
                if len(set(op.values)) != len(op.values):
                    result.anomalies.append(
                        Anomaly("duplicate-elements", (t.id,), f"{op.key!r} read {op.values}")
                    )
                reads[op.key].append((t.id, op.values))
    orders: dict[Hashable, tuple] = {}
    for key, seen in reads.items():
        longest = max((values for _, values in seen), key=len)
        for tid, values in seen:
            if longest[: len(values)] != values:
                result.anomalies.append(
                    Anomaly(
                        "incompatible-order",
                        (tid,),
                        f"{key!r}: read {values} is not a prefix of {longest}",
                    )
                )
        orders[key] = longest
    return orders


def _aborted_and_intermediate_reads(
    txns: Sequence[Transaction],
    by_id: dict[int, Transaction],
    writer: dict[tuple[Hashable, Hashable], int],
    result: CheckResult,
) -> None:
    for t in txns:
        if t.outcome == "fail":
            continue
        for op in t.ops:
            if not isinstance(op, Read):
                continue
            for value in op.values:
                w = writer.get((op.key, value))
                if w is not None and by_id[w].outcome == "fail":
                    result.anomalies.append(
                        Anomaly("G1a", (t.id, w), f"read {op.key!r}={value!r} of failed {w}")
                    )
            if not op.values:
                continue
            w = writer.get((op.key, op.values[-1]))
            if w is None or w == t.id:
                continue
            appended = [o.value for o in by_id[w].ops if isinstance(o, Append) and o.key == op.key]
            if appended[-1] != op.values[-1]:
                result.anomalies.append(
                    Anomaly(
                        "G1b",
                        (t.id, w),
                        f"read {op.key!r} ending at {op.values[-1]!r}, an intermediate "
                        f"append of {w}",
                    )
                )


Graph = dict[int, dict[int, set[EdgeKind]]]


def _add(graph: Graph, a: int, b: int, kind: EdgeKind) -> None:
    if a != b:
        graph[a].setdefault(b, set()).add(kind)


def _dependencies(
    txns: Sequence[Transaction],
    orders: dict[Hashable, tuple],
    writer: dict[tuple[Hashable, Hashable], int],
    committed: set[int],
) -> Graph:
    graph: Graph = defaultdict(dict)
    unseen: dict[Hashable, set[int]] = defaultdict(set)
    for (key, value), w in writer.items():
        if w in committed and value not in orders.get(key, ()):
            unseen[key].add(w)
    for key, order in orders.items():
        writers = [writer.get((key, v)) for v in order]
        for a, b in itertools.pairwise(writers):
            if a is not None and b is not None:
                _add(graph, a, b, "ww")
    for t in txns:
        if t.id not in committed:
            continue
        for op in t.ops:
            if not isinstance(op, Read):
                continue
            order = orders.get(op.key, ())
            if op.values:
                w = writer.get((op.key, op.values[-1]))
                if w is not None:
                    _add(graph, w, t.id, "wr")
            if len(op.values) < len(order):
                w = writer.get((op.key, order[len(op.values)]))
                if w is not None:
                    _add(graph, t.id, w, "rw")
            else:
                # Committed appends no read saw still follow every read of the key.
                for w in unseen.get(op.key, ()):
                    _add(graph, t.id, w, "rw")
    return graph


def _realtime_edges(txns: Sequence[Transaction], committed: set[int], graph: Graph) -> None:
    """``a`` rt ``b`` when ``a`` completed before ``b`` was invoked; only the transitive
    reduction's frontier is added (each ``b`` gets edges from the latest-completing
    predecessors), which keeps the graph small without losing a cycle."""
    timed = [
        t
        for t in txns
        if t.id in committed
        and t.outcome == "ok"
        and t.invoked is not None
        and t.completed is not None
    ]
    by_completion = sorted(timed, key=lambda t: t.completed or 0.0)
    for b in timed:
        assert b.invoked is not None
        before = [a for a in by_completion if (a.completed or 0.0) < b.invoked]
        if not before:
            continue
        # Every predecessor completed before the latest one was invoked is already ordered
        # before it transitively; link only the ones that overlap the latest.
        latest_invoked = max(a.invoked or 0.0 for a in before)
        for a in before:
            if (a.completed or 0.0) >= latest_invoked or a.invoked == latest_invoked:
                _add(graph, a.id, b.id, "rt")


def _strongly_connected(graph: Graph) -> list[list[int]]:
    """Tarjan's algorithm, iteratively (histories can be deep)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    components: list[list[int]] = []
    counter = 0
    nodes = set(graph) | {b for targets in graph.values() for b in targets}
    for root in nodes:
        if root in index:
            continue
        work: list[tuple[int, Iterable[int]]] = [(root, iter(list(graph.get(root, {}))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(list(graph.get(child, {})))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return components


def _find_cycle(graph: Graph, members: set[int], allowed: set[EdgeKind]) -> list[int] | None:
    """A shortest cycle inside ``members`` using only ``allowed`` edges (BFS from each node)."""
    for start in sorted(members):
        parents: dict[int, int] = {}
        frontier = [start]
        seen = {start}
        while frontier:
            nxt = []
            for node in frontier:
                for child, kinds in graph.get(node, {}).items():
                    if child not in members or not kinds & allowed:
                        continue
                    if child == start:
                        path = [node]
                        while path[-1] != start:
                            path.append(parents[path[-1]])
                        return list(reversed(path))
                    if child not in seen:
                        seen.add(child)
                        parents[child] = node
                        nxt.append(child)
            frontier = nxt
    return None


def _describe(graph: Graph, cycle: list[int]) -> tuple[list[EdgeKind], str]:
    kinds: list[EdgeKind] = []
    parts = []
    for a, b in zip(cycle, [*cycle[1:], cycle[0]], strict=True):
        edge = graph[a][b]
        # Name the strongest dependency the edge carries (ww < wr < rw < rt).
        kind: EdgeKind = next(k for k in ("ww", "wr", "rw", "rt") if k in edge)  # type: ignore[assignment]
        kinds.append(kind)
        parts.append(f"T{a} -{kind}-> T{b}")
    return kinds, ", ".join(parts)


def _cycles(graph: Graph) -> list[Anomaly]:
    """One anomaly per strongly connected component, the weakest class it contains."""
    anomalies = []
    for component in _strongly_connected(graph):
        members = set(component)
        for name, allowed in (
            ("G0", {"ww"}),
            ("G1c", {"ww", "wr"}),
            ("G2", {"ww", "wr", "rw"}),
            ("G2-realtime", {"ww", "wr", "rw", "rt"}),
        ):
            cycle = _find_cycle(graph, members, set(allowed))  # type: ignore[arg-type]
            if cycle is None:
                continue
            kinds, text = _describe(graph, cycle)
            if name.startswith("G2"):
                single = kinds.count("rw") == 1
                base = "G-single" if single else ("G2" if "rw" in kinds else "G1c")
                name = base + ("-realtime" if "rt" in kinds else "")
            anomalies.append(Anomaly(name, tuple(cycle), text))
            break
    return anomalies
