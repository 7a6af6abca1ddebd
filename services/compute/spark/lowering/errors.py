"""Spark's errors from running a lowered plan, as Tidemark errors.

Values never fail (the lowering makes overflow, division by zero and bad casts NULL, as the
contract says), so what Spark can still raise is about the query itself: a multiplicity past
64 bits, or multiplicities past 2^42 in one group's BIGINT sum (both checked explicitly,
whatever the session's ANSI mode), a cancelled job, memory, or a bug in a fallback UDF.
"""

from __future__ import annotations

from pyspark.errors import PySparkException, PythonException
from pyspark.sql import DataFrame, Row

from services.compute.spark.lowering.types import INT64_SUM_OVERFLOW, MULTIPLICITY_OVERFLOW
from tidemark.errors import Cancelled, Internal, ResourceExhausted, TidemarkError
from tidemark.logging import get_logger

log = get_logger("compute.spark.errors")


def translate(error: Exception) -> TidemarkError | None:
    """The Tidemark error for an exception Spark raised, or None if it is not Spark's."""
    text = str(error)
    for overflow in (MULTIPLICITY_OVERFLOW, INT64_SUM_OVERFLOW):
        if overflow in text:
            return Internal(overflow.removeprefix("tidemark: "))
    if isinstance(error, PythonException):
        return Internal(f"a Python fallback failed in Spark: {text.splitlines()[0]}")
    if not isinstance(error, PySparkException) and "Py4J" not in type(error).__name__:
        return None
    if "cancelled" in text.lower():
        return Cancelled("the Spark job was cancelled")
    if "OutOfMemory" in text or "Not enough memory" in text:
        return ResourceExhausted(f"Spark ran out of memory: {text.splitlines()[0]}")
    # The first line of a Java error is often only the call that failed ("An error occurred
    # while calling o123.getResult"): the cause is further down, so the log keeps it whole.
    log.warning("spark_failed", error_type=type(error).__name__, error=text)
    return Internal(f"Spark failed: {_summary(text) or type(error).__name__}")


def _summary(text: str) -> str:
    """The first line of ``text`` and, for a Java error, the error it wraps."""
    lines = text.splitlines()
    if not lines:
        return ""
    cause = next((line.strip(": ") for line in lines[1:] if line.startswith(": ")), "")
    summary = f"{lines[0]} {cause}" if cause else lines[0]
    return summary if len(summary) <= _SUMMARY_CHARS else summary[: _SUMMARY_CHARS - 1] + "…"


_SUMMARY_CHARS = 400


def collect(df: DataFrame) -> list[Row]:
    """``df.collect()``, raising Tidemark errors for Spark's."""
    try:
        return df.collect()
    except Exception as error:
        translated = translate(error)
        if translated is None:
            raise
        raise translated from error
