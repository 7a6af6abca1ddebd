"""DuckDB set to PostgreSQL's conventions where the two differ, so it can serve as the
independent answer for Tidemark's SQL: integer division truncates, NULLs sort last ascending
and first descending, and division by zero is NULL (DuckDB 1.x does that by default; later
versions need the setting)."""

from __future__ import annotations

import duckdb


def postgres_conventions(connection: duckdb.DuckDBPyConnection) -> None:
    connection.execute("SET integer_division = true")
    connection.execute("SET default_null_order = 'nulls_last_on_asc_first_on_desc'")
    try:
        connection.execute("SET error_on_division_by_zero = false")
    except duckdb.CatalogException:
        pass  # DuckDB 1.x: no such setting, and division by zero is NULL already
