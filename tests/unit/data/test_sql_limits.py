"""Memory and time limits on user SQL (``rankscope sql``, the dashboard console): a query
that would take the machine's memory or run forever is stopped, and the message says
which limit it hit and how to change it (issue #28, item 7).

The attack these guard against: ``list(...)`` of millions of strings, then ``unnest``,
reached 3 GiB in 2-6 s under DuckDB's default memory_limit (80% of RAM).

Split by tier: what needs processes, sockets or seconds is in tests/integration/data/test_sql_limits.py."""

from __future__ import annotations

import pytest

from collector.data import catalog

MEMORY_ENV, TIME_ENV = "RANKSCOPE_SQL_MEMORY_LIMIT", "RANKSCOPE_SQL_TIME_LIMIT"


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "data"
    catalog.ensure_catalog(d)
    return d


@pytest.fixture(autouse=True)
def _no_limits_from_the_environment(monkeypatch):
    monkeypatch.delenv(MEMORY_ENV, raising=False)
    monkeypatch.delenv(TIME_ENV, raising=False)


def test_the_memory_limit_cannot_be_raised_from_inside(data):
    for sql, says in [
        ("SET memory_limit = '100GB'", "SET statement"),
        ("RESET memory_limit", "statement"),
        ("PRAGMA memory_limit = '100GB'", "SET statement"),  # DuckDB parses it as a SET
        ("SET GLOBAL memory_limit = '100GB'", "SET statement"),
    ]:
        with pytest.raises(catalog.QueryError, match=says):
            catalog.run_readonly_query(data, sql, memory_limit=256 << 20)
    # and not only by the statement check: the connection's configuration is locked
    con = catalog.readonly_connection(data, memory_limit=256 << 20)
    try:
        with pytest.raises(Exception, match="configuration has been locked"):
            con.execute("SET memory_limit = '100GB'")
        assert con.execute("SELECT current_setting('memory_limit')").fetchall() == [("256.0 MiB",)]
    finally:
        con.close()


def test_the_default_memory_limit_is_applied_in_process(data):
    shown = catalog.run_readonly_query(data, "SELECT current_setting('memory_limit') AS m")
    assert shown["m"][0].as_py() == "1.0 GiB"


def test_a_result_larger_than_the_memory_limit_is_stopped_too(data):
    # DuckDB's limit covers its operators, not the result handed to Python: the guard counts that.
    # 100,000 rows of 10 KB: ~1 GB of result, each batch far under the limit
    big_rows = "SELECT repeat('x', 10000 + (range % 2)::INT) AS s FROM range(100000)"
    with pytest.raises(catalog.QueryError, match=r"its result is larger than the 256 MiB memory limit"):
        catalog.run_readonly_query(data, big_rows, max_rows=None, memory_limit=256 << 20)


def test_limits_resolve_flag_then_environment_then_default(monkeypatch):
    assert catalog.SqlLimits.resolve() == catalog.SqlLimits(memory_bytes=1 << 30, time_s=30.0)
    monkeypatch.setenv(MEMORY_ENV, "512MiB")
    monkeypatch.setenv(TIME_ENV, "5")
    assert catalog.SqlLimits.resolve() == catalog.SqlLimits(memory_bytes=512 << 20, time_s=5.0)
    assert catalog.SqlLimits.resolve("2G", "none") == catalog.SqlLimits(memory_bytes=2 << 30, time_s=None)
    assert catalog.parse_byte_size("1.5 GiB") == 3 << 29
    assert catalog.parse_byte_size("4096") == 4096
