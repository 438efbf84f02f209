"""``rankscope whatif``: its flags; the replay is collector/data/whatif, the printing
collector/tools/whatif.py."""

from __future__ import annotations

import argparse

from collector.tools.commands.common import data_dir_arg

NAME = "whatif"
HELP = (
    "Replay each step's dependency graph with every op at its typical duration: the slowdown S "
    "stragglers cost, and whose ops (op type, dp_rank, stage, worker) it belongs to, with M_W and M_S."
)
EXAMPLES = """
    rankscope import trace-AR.parquet --run AR        # an OSDI'25 trace (meta-AR.yaml beside it)
    rankscope whatif AR                               # the figures, in words and a table
    rankscope whatif AR --json | jq .by_stage         # also: slowdown, by_optype, by_worker, m_w, m_s, per_step
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    data_dir_arg(p)
    p.add_argument("run", metavar="RUN", help="run id, or run name (the newest run of that name)")
    p.add_argument("--json", action="store_true", help="print every figure, per step too, as JSON")


def run(args: argparse.Namespace) -> int:
    from collector.tools.whatif import main as whatif_main

    return whatif_main(args)
