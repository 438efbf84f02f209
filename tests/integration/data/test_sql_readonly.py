"""The SQL console (``rankscope sql``, collector.data.catalog.run_readonly_query) reads the
catalog and nothing else: statements that write, load, attach, configure or export
are refused by type; table functions that would read files outside D/parquet are
refused by DuckDB's allowed_directories; a runaway query is stopped by the time
limit, and results are capped. (tests/integration/data/test_catalog.py covers the basics:
INSERT, CREATE, DROP, COPY, ATTACH, INSTALL, SET, two statements.)

Split by tier: the pure-function tests are in tests/unit/data/test_sql_readonly.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.unit.data import test_sql_readonly as unit_tier

data = unit_tier.data  # the unit tier's fixture, shared


@pytest.mark.parametrize(
    "sql, says",
    [
        ("COPY (SELECT 1) TO '/tmp/rankscope-copy.csv'", "COPY statement"),
        ("SELECT * FROM read_text('/etc/passwd')", "Permission Error"),
        ("ATTACH '/tmp/rankscope-attach.duckdb' AS x", "ATTACH statement"),
    ],
)
def test_rankscope_sql_cli_refuses_with_a_message(data, sql, says):
    proc = subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", "sql", "--data-dir", str(data), sql],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("rankscope sql: ") and says in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
