"""Memory and time limits on user SQL (``rankscope sql``, the dashboard console): a query
that would take the machine's memory or run forever is stopped, and the message says
which limit it hit and how to change it (issue #28, item 7).

The attack these guard against: ``list(...)`` of millions of strings, then ``unnest``,
reached 3 GiB in 2-6 s under DuckDB's default memory_limit (80% of RAM)."""

from __future__ import annotations

import os
import time

import pytest

from collector.data import catalog
from tests._cli_child import run_cli

# ~3 GiB with no limit: 3M strings of 1000 bytes gathered into one list, then unnested
ATTACK = (
    "SELECT count(*) AS n, max(length(x)) AS m FROM (SELECT unnest(list(repeat('x', 1000))) AS x FROM range(3000000))"
)
MEMORY_ENV, TIME_ENV = "RANKSCOPE_SQL_MEMORY_LIMIT", "RANKSCOPE_SQL_TIME_LIMIT"
FOREVER = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "data"
    catalog.ensure_catalog(d)
    return d


@pytest.fixture(autouse=True)
def _no_limits_from_the_environment(monkeypatch):
    monkeypatch.delenv(MEMORY_ENV, raising=False)
    monkeypatch.delenv(TIME_ENV, raising=False)


def _cli(data, *args, env=None) -> tuple[int, str, str, int]:
    """``rankscope sql`` in a child process: exit code, stdout, stderr, and the child's own peak
    RSS in bytes (tests/_cli_child.py)."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_SQL_")}
    child_env.update(env or {})
    return run_cli("sql", "--data-dir", str(data), *args, env=child_env)


def test_the_list_unnest_attack_is_stopped_by_the_default_memory_limit(data):
    code, out, err, maxrss = _cli(data, ATTACK)
    assert code == 1, (out, err)
    assert err.startswith("rankscope sql: query stopped"), err
    assert "1 GiB memory limit" in err and "--sql-memory-limit" in err, err
    assert "Traceback" not in err and out == ""
    # the default limit is 1 GiB; the interpreter, pyarrow and duckdb themselves take ~150 MiB
    assert maxrss < 1.6 * 2**30, f"peak RSS {maxrss / 2**30:.2f} GiB"


def test_the_memory_limit_is_set_by_flag_or_environment(data):
    code, _, err, maxrss = _cli(data, "--sql-memory-limit", "256MiB", ATTACK)
    assert code == 1 and "256 MiB memory limit" in err, err
    assert maxrss < 0.9 * 2**30, f"peak RSS {maxrss / 2**30:.2f} GiB"
    code, _, err, _ = _cli(data, ATTACK, env={MEMORY_ENV: "300MB"})
    assert code == 1 and "300 MiB memory limit" in err and MEMORY_ENV in err, err
    # the flag wins over the environment; a query that fits runs
    code, out, err, _ = _cli(
        data, "--sql-memory-limit", "2GiB", "SELECT current_setting('memory_limit') AS m", env={MEMORY_ENV: "1MB"}
    )
    assert code == 0, err
    assert "2.0 GiB" in out


@pytest.mark.parametrize(
    "flag, value", [("--sql-memory-limit", "lots"), ("--sql-memory-limit", "0"), ("--sql-time-limit", "-1")]
)
def test_a_bad_limit_is_a_usage_error_naming_it(data, flag, value):
    code, _, err, _ = _cli(data, flag, value, "SELECT 1")
    assert code == 2 and flag in err and "Traceback" not in err, err


def test_a_bad_limit_in_the_environment_is_an_error_naming_it(data):
    code, _, err, _ = _cli(data, "SELECT 1", env={TIME_ENV: "soon"})
    assert code == 2 and TIME_ENV in err and "Traceback" not in err, err


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


def test_the_time_limit_is_set_by_flag_and_says_so(data):
    started = time.monotonic()
    code, out, err, _ = _cli(data, "--sql-time-limit", "1", FOREVER)
    elapsed = time.monotonic() - started
    assert code == 1, (out, err)
    assert "query stopped after 1 s" in err and "--sql-time-limit" in err, err
    # the query never ends by itself: it was stopped (1 s + interpreter start, generous for a loaded box)
    assert elapsed < 60
    code, _, err, _ = _cli(data, FOREVER, env={TIME_ENV: "0.5"})
    assert code == 1 and "query stopped after 0.5 s" in err and TIME_ENV in err, err


def test_limits_resolve_flag_then_environment_then_default(monkeypatch):
    assert catalog.SqlLimits.resolve() == catalog.SqlLimits(memory_bytes=1 << 30, time_s=30.0)
    monkeypatch.setenv(MEMORY_ENV, "512MiB")
    monkeypatch.setenv(TIME_ENV, "5")
    assert catalog.SqlLimits.resolve() == catalog.SqlLimits(memory_bytes=512 << 20, time_s=5.0)
    assert catalog.SqlLimits.resolve("2G", "none") == catalog.SqlLimits(memory_bytes=2 << 30, time_s=None)
    assert catalog.parse_byte_size("1.5 GiB") == 3 << 29
    assert catalog.parse_byte_size("4096") == 4096
