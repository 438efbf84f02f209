"""``rankscope dashboard``: the Streamlit dashboard over a data dir, in this process's place."""

from __future__ import annotations

import argparse
import os

from collector.tools.commands.common import data_dir_arg, sql_limit_args, sql_limits

NAME = "dashboard"
HELP = "Serve the Streamlit dashboard over a data directory."
EXAMPLES = """
    rankscope dashboard
    rankscope dashboard --data-dir sample_runs --port 8502
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    data_dir_arg(p)
    p.add_argument("--port", type=int, default=8501)
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
    sql_limit_args(p)  # the SQL console's


def run(args: argparse.Namespace) -> int:
    from collector.data.catalog import SQL_MEMORY_LIMIT_ENV, SQL_TIME_LIMIT_ENV
    from collector.tools.launch import dashboard_command

    if sql_limits(args, "dashboard") is None:
        return 2
    # the console reads its limits from the environment the dashboard process inherits
    for value, env in ((args.sql_memory_limit, SQL_MEMORY_LIMIT_ENV), (args.sql_time_limit, SQL_TIME_LIMIT_ENV)):
        if value is not None:
            os.environ[env] = value
    cmd = dashboard_command(args.data_dir, port=args.port, host=args.host)
    os.execv(cmd[0], cmd)
