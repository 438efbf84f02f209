"""``rankscope nvme-tune``: native.nvme_tune in this process's place (it needs torch, which the
command line does not import)."""

from __future__ import annotations

import argparse
import os
import sys

NAME = "nvme-tune"
HELP = "Sweep async I/O handle settings on a directory and print the best `aio` config block."
EXAMPLES = """
    rankscope nvme-tune --dir /local_nvme
    rankscope nvme-tune --dir /local_nvme --io-size 268435456 --loops 3
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", required=True, help="a writable directory on the device to tune")
    p.add_argument(
        "rest", nargs=argparse.REMAINDER, help="more options for the tuner (see python -m native.nvme_tune --help)"
    )


def run(args: argparse.Namespace) -> int:
    cmd = [sys.executable, "-m", "native.nvme_tune", "--dir", args.dir, *args.rest]
    os.execv(cmd[0], cmd)
