"""``rankscope sql``: its flags; the console is collector/tools/sql.py."""

from __future__ import annotations

import argparse

from collector.tools.commands.common import data_dir_arg, sql_limit_args, sql_limits

NAME = "sql"
HELP = "Run a read-only SQL query over the catalog and print the result."
EXAMPLES = """
    rankscope sql "select * from runs"
    rankscope sql --data-dir sample_runs "select rank, avg(busbw_gbs) from comm group by rank"
    rankscope sql --sql-memory-limit 4GiB --sql-time-limit 120 "select op, count(*) from comm group by op"
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    data_dir_arg(p)
    sql_limit_args(p)
    p.add_argument("query", help="a SELECT / WITH / DESCRIBE / SHOW query")


def run(args: argparse.Namespace) -> int:
    from collector.tools.sql import run as run_query

    limits = sql_limits(args, "sql")
    if limits is None:
        return 2
    return run_query(args.data_dir, args.query, limits=limits)
