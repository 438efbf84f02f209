"""``rankscope health``: its flags; the findings are printed by collector/tools/health.py."""

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


def run(args: argparse.Namespace) -> int:
    from collector.tools.health import main as health_main

    return health_main(args)
