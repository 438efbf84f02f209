"""``rankscope probe``: its flags; the request and the table it prints are collector/tools/probe.py."""

from __future__ import annotations

import argparse

from collector.tools.commands.common import data_dir_arg, endpoint_arg, resolve_endpoint, tls_ca_arg

NAME = "probe"
HELP = "Time the links between a live run's hosts (a bounded exchange per pair) and name the slow one."
EXAMPLES = """
    rankscope probe demo                                  # the hosts a slow-link finding leaves, or all
    rankscope probe bert-large --hosts node-07,node-12,node-13 --bytes 8MiB
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    data_dir_arg(p)
    p.add_argument("run", metavar="RUN", help="run id, or run name (resolved in --data-dir where readable)")
    p.add_argument(
        "--hosts",
        default="",
        metavar="H[,H]",
        help="hosts to time (default: those the run's slow-link finding leaves and 2 others; without one, every "
        "host, at most 8)",
    )
    p.add_argument("--bytes", default="4MiB", metavar="N", help="bytes each way per pair, at most 64MiB (default 4MiB)")
    p.add_argument("--timeout", type=float, default=3.0, metavar="S", help="cut each transfer at S seconds (default 3)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    endpoint_arg(p)
    p.add_argument("--token", default=None, help="the collector's bearer token (default: $RANKSCOPE_TOKEN)")
    tls_ca_arg(p)


def run(args: argparse.Namespace) -> int:
    from collector.tools.probe import main

    resolve_endpoint(args, NAME)
    return main(args)
