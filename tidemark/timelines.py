"""The oracle timelines Tidemark uses.

Catalog times and data times are separate timelines: DDL is ordered in ``CATALOG``; every table,
source, view and materialized view lives in ``DATA`` (u64 milliseconds). A query carries one
time of each: the catalog time it was planned at and the data time it reads at.
"""

from __future__ import annotations

CATALOG = "catalog"
DATA = "data"
