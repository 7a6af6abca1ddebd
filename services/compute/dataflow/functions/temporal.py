"""Date and timestamp functions (``datetime.datetime`` is a ``datetime.date``, so the
extract functions serve both)."""

from __future__ import annotations

import calendar
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


def add_days(value: datetime.date, days: int) -> datetime.date | None:
    try:
        return value + datetime.timedelta(days=days)
    except OverflowError:
        return None


def days_between(later: datetime.date, earlier: datetime.date) -> int:
    return (later - earlier).days


def add_months(value: datetime.datetime, months: int) -> datetime.datetime | None:
    index = value.year * 12 + (value.month - 1) + months
    year, month = divmod(index, 12)
    if not 1 <= year <= 9999:
        return None
    day = min(value.day, calendar.monthrange(year, month + 1)[1])
    return value.replace(year=year, month=month + 1, day=day)


def add_microseconds(value: datetime.datetime, microseconds: int) -> datetime.datetime | None:
    try:
        return value + datetime.timedelta(microseconds=microseconds)
    except OverflowError:
        return None
