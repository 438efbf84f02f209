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


def endpoint_arg(p: argparse.ArgumentParser, *, what: str = "collector address") -> None:
    """--endpoint, default: the collector advertised in --data-dir (``resolve_endpoint``)."""
    p.add_argument(
        "--endpoint",
        default=None,
        metavar="HOST:PORT",
        help=f"{what} (default: the collector serving --data-dir, from D/collector.json; else {DEFAULT_ENDPOINT})",
    )


def resolve_endpoint(args: argparse.Namespace, command: str) -> str:
    """--endpoint when given; else the collector advertised in --data-dir (D/collector.json, written
    by a running ``rankscope collect`` or ``rankscope demo``); else the default port. Says on stderr
    which it took, so a refusal names the address it came from."""
    from collector.data import live_collector

    if args.endpoint:
        return args.endpoint
    data_dir = getattr(args, "data_dir", None) or DEFAULT_DATA_DIR
    live = live_collector.read(data_dir)
    if live is not None:
        token_note = " (it wants a token: --token or $RANKSCOPE_TOKEN)" if live.token_required else ""
        print(
            f"rankscope {command}: using the collector at {live.endpoint}, "
            f"from {live_collector.path(data_dir)}{token_note}",
            file=sys.stderr,
        )
        args.endpoint = live.endpoint
        return live.endpoint
    print(
        f"rankscope {command}: no running collector advertised in {live_collector.path(data_dir)}; "
        f"trying {DEFAULT_ENDPOINT} (pass --endpoint HOST:PORT or the collector's --data-dir)",
        file=sys.stderr,
    )
    args.endpoint = DEFAULT_ENDPOINT
    return DEFAULT_ENDPOINT


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
