"""``rankscope calibrate``: launch an nccl-tests-style sweep on this machine's ranks, or (under
torchrun: RANK in the environment) be one rank of it; collector.tools.calibrate does the work."""

from __future__ import annotations

import argparse
import os
import sys

NAME = "calibrate"
HELP = "Measure each collective's bandwidth per size and group span on these hosts; later runs are judged by it."
EXAMPLES = """
    rankscope calibrate --nproc 4 --data-dir D
    rankscope calibrate --nproc 8 --sizes 1M,16M,256M --ops all_reduce,all_gather
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:29500 -m collector.tools.calibrate --data-dir /shared/rs
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from collector.tools.calibrate import add_arguments as sweep_arguments

    sweep_arguments(p)
    p.add_argument(
        "--nproc", type=int, default=2, help="ranks to launch on this machine (default 2; ignored under torchrun)"
    )


def run(args: argparse.Namespace) -> int:
    from collector.tools import calibrate

    try:
        calibrate.parse_sizes(args.sizes)
        calibrate.parse_ops(args.ops)
    except ValueError as exc:
        print(f"rankscope calibrate: {exc}", file=sys.stderr)
        return 2
    if args.iters < 1 or args.nproc < 2:
        print("rankscope calibrate: --iters must be >= 1 and --nproc >= 2", file=sys.stderr)
        return 2
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # one rank of a torchrun launch
        calibrate.sweep(args)
    return calibrate.launch(args, args.nproc)
