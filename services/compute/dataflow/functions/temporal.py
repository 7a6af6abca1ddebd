"""Date and timestamp functions (``datetime.datetime`` is a ``datetime.date``, so the
extract functions serve both)."""

from __future__ import annotations

import datetime


def extract_year(value: datetime.date) -> int:
    return value.year


def extract_month(value: datetime.date) -> int:
    return value.month


def extract_day(value: datetime.date) -> int:
    return value.day


def date_trunc_day(value: datetime.datetime) -> datetime.datetime:
    return datetime.datetime(value.year, value.month, value.day)


def date_to_timestamp(value: datetime.date) -> datetime.datetime:
    return datetime.datetime(value.year, value.month, value.day)


def timestamp_to_date(value: datetime.datetime) -> datetime.date:
    return value.date()
