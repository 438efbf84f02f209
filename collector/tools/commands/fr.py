"""``rankscope fr``: its flags; the import and the verdict are collector/tools/flight_recorder_verdict.py."""

from __future__ import annotations

import argparse

from collector.tools.commands.common import data_dir_arg

NAME = "fr"
HELP = (
    "Import a job's Flight Recorder dumps (one per rank) and judge them in one command: hangs with the "
    "missing ranks and their last stacks, collective mismatches, ranks without a dump (exit as health)."
)
EXAMPLES = """
    rankscope fr /tmp/fr_dumps/                    # nccl_trace_rank_0 ... as TORCH_NCCL_DEBUG_INFO_TEMP_FILE wrote them
    rankscope fr dumps/ --run job42 --data-dir /scratch/rs --json
    rankscope fr dumps/ || page-oncall             # exit 2: a hang or mismatch
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    data_dir_arg(p)
    p.add_argument(
        "dir", metavar="DIR", help="a folder of per-rank Flight Recorder dumps (pickle or JSON), or one dump"
    )
    p.add_argument("--run", default=None, help="run name for the import (default: the folder's name)")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON (findings, stacks, notes)")


def run(args: argparse.Namespace) -> int:
    from collector.tools.flight_recorder_verdict import main

    return main(args)
