"""``rankscope health``: its flags; the findings come from the collector serving the data dir when
one follows the run live (collector/tools/live_health.py: its Health RPC, in a fraction of a
second), else they are computed from the data dir (collector/tools/health.py)."""

from __future__ import annotations

import argparse

from collector.tools.commands.common import data_dir_arg

NAME = "health"
HELP = "Print a run's current findings (exit 0 none, 1 warnings, 2 a hang, desync or silent rank)."
EXAMPLES = """
    rankscope health demo                          # the newest run named demo
    rankscope health demo-20261123-101500-a1b2c3 --json
    rankscope health bert-large --data-dir /scratch/rs || notify-oncall
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    data_dir_arg(p)
    p.add_argument("run", metavar="RUN", help="run id, or run name (the newest run of that name)")
    p.add_argument("--json", action="store_true", help="print the findings as a JSON list")
    p.add_argument("--all", action="store_true", help="print the notes (info findings) as well")
    p.add_argument(
        "--no-live",
        action="store_true",
        help="compute from the data dir even when a running collector serving it follows the run "
        "(default: ask that collector, from D/collector.json, for the findings it holds)",
    )


def run(args: argparse.Namespace) -> int:
    if not args.no_live:
        from collector.tools.live_health import ask

        answered = ask(args)
        if answered is not None:
            return answered
    from collector.tools.health import main as health_main

    return health_main(args)
