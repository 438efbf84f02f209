"""The SQL console: user SQL through the read-only guard (collector.data.sql_guard)."""

from __future__ import annotations

import pandas as pd

from collector.data import catalog


def console_query(data_dir: str, sql: str, max_rows: int) -> pd.DataFrame:
    """User SQL through the read-only guard; raises catalog.QueryError."""
    return catalog.run_readonly_query(data_dir, sql, max_rows=max_rows).to_pandas()
