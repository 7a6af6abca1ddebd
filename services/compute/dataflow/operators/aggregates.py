"""Incremental aggregate states: each folds in ``(value, diff)`` changes and can say its
current result in O(1) (MIN/MAX: O(log n) per change in the group's distinct values, O(1) to
read), independent of the order changes arrive in.

Exactness is what makes results deterministic: integer and decimal sums are kept as exact
integers, and float sums as an exact integer count of 2**-1074 units (every finite double is a
whole number of those), rounded to a double only when the result is read. That rounding is the
correctly rounded exact sum, which is what ``math.fsum`` returns.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from services.compute.dataflow.functions import decimals
from services.compute.dataflow.operators.sorted_weights import SortedWeights
from services.compute.dataflow.ordering import NAN, canonical_float, float_key
from tidemark.errors import FailedPrecondition, Internal

_FLOAT_UNIT_BITS = 1074
_FLOAT_ONE = 1 << _FLOAT_UNIT_BITS
_INF = float("inf")


class Aggregate(ABC):
    """The state of one aggregate for one group."""

    __slots__ = ()

    parts_width: ClassVar[int | None] = None
    """For a state that is nothing but sums over its changes, how many numbers ``parts``
    gives (a group's partial aggregate, which adds up with others: ``add_parts``); None for
    a state that keeps its values (MIN, MAX, DISTINCT)."""

    def parts(self) -> tuple[int, ...]:
        """The state as ``parts_width`` integers, which ``add_parts`` adds to another."""
        raise Internal(f"{type(self).__name__} keeps its values: it has no partial aggregate")

    def add_parts(self, parts: Sequence[int], diff: int) -> None:
        """Adds ``diff`` times a state given as its ``parts``: the same as adding, ``diff``
        times over, every change that made that state."""
        raise Internal(f"{type(self).__name__} keeps its values: it has no partial aggregate")

    @abstractmethod
    def add(self, value: Any, diff: int) -> None:
        """``diff`` more copies of ``value`` (None for NULL; negative diffs remove)."""

    def add_all(self, values: Sequence[Any], diffs: Sequence[int]) -> None:
        """``add`` of each of ``values`` with its diff: a group's changes at one time, in
        one call rather than one per row (the commonest aggregates override it with a loop
        of their own)."""
        for value, diff in zip(values, diffs, strict=True):
            self.add(value, diff)

    @abstractmethod
    def result(self, rows: int) -> Any:
        """The aggregate's value; ``rows`` is the group's total multiplicity."""

    @abstractmethod
    def is_empty(self) -> bool:
        """Whether the state is that of an empty group (so the group can be dropped)."""

    def values_held(self) -> int:
        """How many distinct values the state keeps (for the state's size); O(1)."""
        return 0


class CountRows(Aggregate):
    """COUNT(*): the group's multiplicity, which the group tracks itself."""

    __slots__ = ()
    parts_width = 0

    def add(self, value: Any, diff: int) -> None:
        pass

    def add_all(self, values: Sequence[Any], diffs: Sequence[int]) -> None:
        pass

    def parts(self) -> tuple[int, ...]:
        return ()

    def add_parts(self, parts: Sequence[int], diff: int) -> None:
        pass

    def result(self, rows: int) -> Any:
        return rows

    def is_empty(self) -> bool:
        return True


class CountValues(Aggregate):
    __slots__ = ("count",)
    parts_width = 1

    def __init__(self) -> None:
        self.count = 0

    def parts(self) -> tuple[int, ...]:
        return (self.count,)

    def add_parts(self, parts: Sequence[int], diff: int) -> None:
        self.count += parts[0] * diff

    def add(self, value: Any, diff: int) -> None:
        if value is not None:
            self.count += diff

    def add_all(self, values: Sequence[Any], diffs: Sequence[int]) -> None:
        self.count += sum(
            diff for value, diff in zip(values, diffs, strict=True) if value is not None
        )

    def result(self, rows: int) -> Any:
        return self.count

    def is_empty(self) -> bool:
        return self.count == 0


class _Summing(Aggregate):
    """Keeps an exact integer total and the count of non-NULL values."""

    __slots__ = ("count", "total")
    parts_width = 2

    def __init__(self) -> None:
        self.total = 0
        self.count = 0

    def parts(self) -> tuple[int, ...]:
        return (self.total, self.count)

    def add_parts(self, parts: Sequence[int], diff: int) -> None:
        self.total += parts[0] * diff
        self.count += parts[1] * diff

    def is_empty(self) -> bool:
        return self.total == 0 and self.count == 0


class SumExact(_Summing):
    """SUM of int64 (scale 0) or DECIMAL(p, scale): the total in units of 10**-scale."""

    __slots__ = ("scale",)

    def __init__(self, scale: int) -> None:
        super().__init__()
        self.scale = scale

    def add(self, value: Any, diff: int) -> None:
        if value is None:
            return
        self.count += diff
        if value.__class__ is int:
            self.total += value * diff
        else:
            self.total += int(value.scaleb(self.scale, decimals.EXACT)) * diff

    def add_all(self, values: Sequence[Any], diffs: Sequence[int]) -> None:
        count = total = 0
        for value, diff in zip(values, diffs, strict=True):
            if value is None:
                continue
            count += diff
            if value.__class__ is int:
                total += value * diff
            else:
                total += int(value.scaleb(self.scale, decimals.EXACT)) * diff
        self.count += count
        self.total += total

    def result(self, rows: int) -> Any:
        if self.count <= 0:
            return None
        return decimals.from_scaled(self.total, self.scale)


class AvgExact(SumExact):
    """AVG of int64 (a float: exact sum / count, correctly rounded) or of DECIMAL(p, s) (a
    DECIMAL(38, min(38, s + 6)), rounded half-even)."""

    __slots__ = ("result_scale",)

    def __init__(self, scale: int, result_scale: int | None) -> None:
        super().__init__(scale)
        self.result_scale = result_scale

    def result(self, rows: int) -> Any:
        if self.count <= 0:
            return None
        if self.result_scale is None:
            return canonical_float(self.total / self.count)
        shift = self.result_scale - self.scale
        return decimals.from_scaled(
            decimals.divide_half_even(self.total * 10**shift, self.count), self.result_scale
        )


class SumFloat(_Summing):
    """SUM of float64: the exact sum correctly rounded, with IEEE rules for NaN and infinities
    (kept as counts, since an infinity can be removed again)."""

    __slots__ = ("nans", "negative_infinities", "positive_infinities")
    parts_width = 5

    def __init__(self) -> None:
        super().__init__()
        self.nans = 0
        self.positive_infinities = 0
        self.negative_infinities = 0

    def parts(self) -> tuple[int, ...]:
        return (
            self.total,
            self.count,
            self.nans,
            self.positive_infinities,
            self.negative_infinities,
        )

    def add_parts(self, parts: Sequence[int], diff: int) -> None:
        total, count, nans, positive, negative = parts
        self.total += total * diff
        self.count += count * diff
        self.nans += nans * diff
        self.positive_infinities += positive * diff
        self.negative_infinities += negative * diff

    def add(self, value: Any, diff: int) -> None:
        if value is None:
            return
        self.count += diff
        if value != value:
            self.nans += diff
        elif value == _INF:
            self.positive_infinities += diff
        elif value == -_INF:
            self.negative_infinities += diff
        else:
            numerator, denominator = value.as_integer_ratio()
            self.total += numerator * (_FLOAT_ONE // denominator) * diff

    def is_empty(self) -> bool:
        return (
            super().is_empty()
            and self.nans == 0
            and self.positive_infinities == 0
            and self.negative_infinities == 0
        )

    def sum(self) -> float:
        if self.nans > 0 or (self.positive_infinities > 0 and self.negative_infinities > 0):
            return NAN
        if self.positive_infinities > 0:
            return _INF
        if self.negative_infinities > 0:
            return -_INF
        try:
            return canonical_float(self.total / _FLOAT_ONE)
        except OverflowError:
            return _INF if self.total > 0 else -_INF

    def result(self, rows: int) -> Any:
        if self.count <= 0:
            return None
        return self.sum()


class AvgFloat(SumFloat):
    __slots__ = ()

    def result(self, rows: int) -> Any:
        if self.count <= 0:
            return None
        return canonical_float(self.sum() / self.count)


class Extreme(Aggregate):
    """MIN or MAX: the multiset of values with the present ones in order (``SortedWeights``),
    so a removed extreme is replaced by the next one without a scan, and an update costs
    O(log n) in the group's distinct values."""

    __slots__ = ("counts", "is_float", "maximum", "present")

    def __init__(self, maximum: bool, is_float: bool) -> None:
        self.maximum = maximum
        self.is_float = is_float
        self.counts: dict[Any, int] = {}
        self.present = SortedWeights()

    def add(self, value: Any, diff: int) -> None:
        if value is None or not diff:
            return
        before = self.counts.get(value, 0)
        after = before + diff
        if after:
            self.counts[value] = after
        else:
            self.counts.pop(value, None)
        if before <= 0 < after:
            self.present.insert(float_key(value) if self.is_float else value, 1)
        elif after <= 0 < before:
            self.present.remove(float_key(value) if self.is_float else value)

    def result(self, rows: int) -> Any:
        if not self.present:
            return None
        key = self.present.last() if self.maximum else self.present.first()
        if self.is_float:
            return NAN if key[0] else key[1]
        return key

    def is_empty(self) -> bool:
        return not self.counts

    def values_held(self) -> int:
        return len(self.counts)


class Distinct(Aggregate):
    """Feeds ``inner`` each distinct non-NULL value once: when its count turns positive, and
    out again when it stops being positive."""

    __slots__ = ("counts", "inner")

    def __init__(self, inner: Aggregate) -> None:
        self.inner = inner
        self.counts: dict[Any, int] = {}

    def add(self, value: Any, diff: int) -> None:
        if value is None:
            return
        before = self.counts.get(value, 0)
        after = before + diff
        if after:
            self.counts[value] = after
        else:
            self.counts.pop(value, None)
        if before <= 0 < after:
            self.inner.add(value, 1)
        elif after <= 0 < before:
            self.inner.add(value, -1)

    def result(self, rows: int) -> Any:
        return self.inner.result(rows)

    def is_empty(self) -> bool:
        return not self.counts

    def values_held(self) -> int:
        return len(self.counts) + self.inner.values_held()


def add_summed_parts(state: Aggregate, parts: Iterator[Any]) -> None:
    """Adds to ``state`` a group's partial aggregates as the Spark lowering computes them for
    an aggregate whose state is sums of diffs (``spark/lowering/aggregates.py``
    ``summed_state``), taking from ``parts`` the ones that aggregate has, in order:

    - COUNT(*): the group's sum of diffs (the group keeps it itself: skipped);
    - COUNT(value): the diffs of non-NULL values;
    - SUM or AVG of an INT64 or DECIMAL: the exact total (a decimal at the value's scale,
      NULL when no value is), the diffs of non-NULL values, and a flag set when a product
      did not fit Spark's decimals.

    Hydration by Spark loads such groups without their rows. They are added as the state's
    own ``parts`` (``add_parts``), as a partial row from another shard is, so that two rows
    of one group sum up."""
    if isinstance(state, CountRows):
        next(parts)
    elif isinstance(state, CountValues):
        state.add_parts((next(parts),), 1)
    elif isinstance(state, SumExact):
        total, count, overflowed = next(parts), next(parts), next(parts)
        if overflowed is not None or (total is None and count):
            raise FailedPrecondition(
                "a SUM's total passes 38 digits: its exact state cannot be built by Spark"
            )
        scaled = 0 if total is None else int(total.scaleb(state.scale, decimals.EXACT))
        state.add_parts((scaled, count), 1)
    else:
        raise Internal(f"{type(state).__name__} keeps more than sums of diffs")
