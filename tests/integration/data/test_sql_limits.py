"""Memory and time limits on user SQL (``rankscope sql``, the dashboard console): a query
that would take the machine's memory or run forever is stopped, and the message says
which limit it hit and how to change it (issue #28, item 7).

The attack these guard against: ``list(...)`` of millions of strings, then ``unnest``,
reached 3 GiB in 2-6 s under DuckDB's default memory_limit (80% of RAM).

Split by tier: the pure-function tests are in tests/unit/data/test_sql_limits.py."""

from __future__ import annotations

import os
import time

import pytest

from tests._cli_child import run_cli
from tests.unit.data import test_sql_limits as unit_tier
from tests.unit.data.test_sql_limits import MEMORY_ENV, TIME_ENV

# the unit tier's fixtures, shared
data, _no_limits_from_the_environment = unit_tier.data, unit_tier._no_limits_from_the_environment

# ~3 GiB with no limit: 3M strings of 1000 bytes gathered into one list, then unnested
ATTACK = (
    "SELECT count(*) AS n, max(length(x)) AS m FROM (SELECT unnest(list(repeat('x', 1000))) AS x FROM range(3000000))"
)
FOREVER = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"


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
