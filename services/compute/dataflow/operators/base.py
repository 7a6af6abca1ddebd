"""The shapes every operator has."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from services.compute.dataflow.batch import KeyFunction, Update
from services.compute.dataflow.work import Work


class LinearOperator(ABC):
    """Maps input updates to output updates one at a time: the output for a batch is the sum
    of the outputs for its updates, so it can run anywhere, on any split of the data."""

    @abstractmethod
    def apply(self, inputs: Sequence[list[Update]]) -> list[Update]: ...


class OperatorState(ABC):
    """One shard's state of a stateful operator.

    ``process`` takes every input update of the step (one list per operator input; any times,
    in any order, all at or beyond the times seen before) and returns the output updates, each
    at the exact time its input changed. It handles the step's times in increasing order, so
    the output at time ``t`` depends only on input at times ``<= t``.
    """

    def __init__(self) -> None:
        self.work = Work()

    @abstractmethod
    def process(self, inputs: Sequence[list[Update]]) -> list[Update]: ...

    @abstractmethod
    def key_count(self) -> int:
        """How many keys the arrangements hold (for diagnostics)."""


class StatefulOperator(ABC):
    """The description of a stateful operator: how to route each input's rows to the shard
    that owns their key, and how to make a shard's empty state."""

    routes: tuple[KeyFunction, ...]

    @abstractmethod
    def new_state(self) -> OperatorState: ...
