"""Linear operators: they act on each update triple independently."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from services.compute.dataflow.batch import Row, Update
from services.compute.dataflow.operators.base import LinearOperator
from services.compute.dataflow.ordering import canonical_float

Evaluator = Callable[[Row], Any]


class Filter(LinearOperator):
    """Keeps the updates whose row makes every predicate TRUE (FALSE and NULL drop it)."""

    def __init__(self, predicates: Sequence[Evaluator]) -> None:
        self.predicates = list(predicates)

    def apply(self, inputs: Sequence[list[Update]]) -> list[Update]:
        (updates,) = inputs
        if len(self.predicates) == 1:
            (predicate,) = self.predicates
            return [update for update in updates if predicate(update[0]) is True]
        predicates = self.predicates
        return [u for u in updates if all(p(u[0]) is True for p in predicates)]


class Map(LinearOperator):
    """Appends one computed column per expression; each expression sees the columns appended
    before it."""

    def __init__(self, expressions: Sequence[Evaluator]) -> None:
        self.expressions = list(expressions)

    def apply(self, inputs: Sequence[list[Update]]) -> list[Update]:
        (updates,) = inputs
        expressions = self.expressions
        out = []
        for row, time, diff in updates:
            for expression in expressions:
                row = (*row, expression(row))
            out.append((row, time, diff))
        return out


class Project(LinearOperator):
    """Picks columns by position (repeats allowed)."""

    def __init__(self, columns: Sequence[int]) -> None:
        self.columns = list(columns)
        if len(self.columns) == 1:
            only = self.columns[0]

            def pick(row: Row) -> Row:
                return (row[only],)

            self.pick: Callable[[Row], Row] = pick
        else:
            self.pick = operator.itemgetter(*self.columns)

    def apply(self, inputs: Sequence[list[Update]]) -> list[Update]:
        (updates,) = inputs
        pick = self.pick
        return [(pick(row), time, diff) for row, time, diff in updates]


class Negate(LinearOperator):
    def apply(self, inputs: Sequence[list[Update]]) -> list[Update]:
        (updates,) = inputs
        return [(row, time, -diff) for row, time, diff in updates]


class Union(LinearOperator):
    def apply(self, inputs: Sequence[list[Update]]) -> list[Update]:
        out: list[Update] = []
        for updates in inputs:
            out.extend(updates)
        return out


class Normalize(LinearOperator):
    """Reads input rows the contract's way: every float NaN becomes the one NaN object and
    -0.0 becomes 0.0, in the float columns given."""

    def __init__(self, float_columns: Sequence[int]) -> None:
        self.float_columns = list(float_columns)

    def apply(self, inputs: Sequence[list[Update]]) -> list[Update]:
        (updates,) = inputs
        if not self.float_columns:
            return updates
        return [(self.row(row), time, diff) for row, time, diff in updates]

    def row(self, row: Row) -> Row:
        fixed = None
        for column in self.float_columns:
            value = row[column]
            if value is not None and (value != value or value == 0.0):
                if fixed is None:
                    fixed = list(row)
                fixed[column] = canonical_float(value)
        return row if fixed is None else tuple(fixed)
