"""Options several ``rankscope`` commands share, declared once."""

from __future__ import annotations

import argparse
import sys
import textwrap

DEFAULT_DATA_DIR = "rankscope-data"
DEFAULT_ENDPOINT = "127.0.0.1:50051"


def examples(text: str) -> str:
    return "examples:\n" + textwrap.indent(textwrap.dedent(text).strip(), "  ")


def data_dir_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data-dir",
        default=DEFAULT_DATA_DIR,
        metavar="D",
        help=f"data directory holding parquet/ and catalog.duckdb (default: ./{DEFAULT_DATA_DIR})",
    )


def tls_ca_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tls-ca",
        default=None,
        metavar="PEM",
        help="verify a TLS collector against this CA file (default: $RANKSCOPE_TLS_CA; none: plaintext)",
    )


def sql_limit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sql-memory-limit",
        default=None,
        metavar="SIZE",
        help="memory one query may use, e.g. 512MiB, 4GiB, or 'none' "
        "(default: $RANKSCOPE_SQL_MEMORY_LIMIT, else 1GiB); a query that needs more is stopped",
    )
    p.add_argument(
        "--sql-time-limit",
        default=None,
        metavar="S",
        help="seconds one query may run, or 'none' (default: $RANKSCOPE_SQL_TIME_LIMIT, else 30)",
    )


def sql_limits(args: argparse.Namespace, command: str):
    """The SQL console's limits from --sql-memory-limit / --sql-time-limit, else the
    environment, else the defaults; None after printing why a value is bad."""
    from collector.data.catalog import SqlLimits

    try:
        return SqlLimits.resolve(args.sql_memory_limit, args.sql_time_limit)
    except ValueError as exc:
        print(f"rankscope {command}: {exc}", file=sys.stderr)
        return None
