"""``rankscope demo``: its flags; the demo itself is collector/tools/demo.py."""

from __future__ import annotations

import argparse

from collector.tools.commands.common import data_dir_arg

NAME = "demo"
HELP = "Start a collector, a live multi-rank CPU training run streaming into it, and the dashboard."
EXAMPLES = """
    rankscope demo
    rankscope demo --nproc 2 --steps 50 --no-dashboard
    rankscope demo --straggler 3:80@100      # rank 3 slowed by 80 ms per step from step 100
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    data_dir_arg(p)
    p.add_argument("--nproc", type=int, default=4, help="training ranks (default 4)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: until Ctrl-C)")
    p.add_argument("--config", default=None, help="engine config JSON (default: the ZeRO-2 example config)")
    p.add_argument(
        "--port",
        type=int,
        default=0,
        help="collector port (default 0: a free one, not the default endpoint other runs on this host may use)",
    )
    p.add_argument("--dashboard-port", type=int, default=8501, help="dashboard port (a free one if 8501 is taken)")
    p.add_argument(
        "--straggler",
        default="1:40@300",
        metavar="RANK:MS@STEP",
        help="the fault staged after a healthy start: RANK busy-waits MS before each forward from STEP on "
        "(default 1:40@300; 'none' for a healthy run)",
    )
    p.add_argument(
        "--training-nice",
        type=int,
        default=10,
        metavar="N",
        help="CPU priority of the training ranks, as nice(1) (default 10: on a laptop the dashboard and the "
        "browser drawing it come first, and the training takes every cycle they leave; 0 for full priority)",
    )
    p.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    p.add_argument("--exit", action="store_true", help="stop everything when the training run ends")


def run(args: argparse.Namespace) -> int:
    from collector.tools.demo import run_demo

    return run_demo(args)
