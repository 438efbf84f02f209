"""``rankscope export``: its flags; the exports are collector/tools/export.py."""

from __future__ import annotations

import argparse

from collector.tools.commands.common import data_dir_arg

NAME = "export"
HELP = "Export a run: a Perfetto/Chrome trace, a self-contained archive, or Parquet files."
EXAMPLES = """
    rankscope export --perfetto bert-large trace.json   # open in ui.perfetto.dev or chrome://tracing
    rankscope export --archive bert-large bert.rsarchive  # replay it anywhere: rankscope replay bert.rsarchive
    rankscope export --parquet bert-large out/          # out/<table>.parquet, with run_id and rank
    rankscope export --flight-recorder hang-run fr/     # fr/rank_<r>: torch's fr_trace analyzer reads them
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    data_dir_arg(p)
    kind = p.add_mutually_exclusive_group(required=True)
    kind.add_argument("--perfetto", nargs=2, metavar=("RUN", "OUT.json"), help="Chrome trace-event JSON")
    kind.add_argument("--archive", nargs=2, metavar=("RUN", "OUT"), help="one file: the run's Parquet and catalog rows")
    kind.add_argument("--parquet", nargs=2, metavar=("RUN", "OUTDIR"), help="one Parquet file per table")
    kind.add_argument(
        "--flight-recorder", nargs=2, metavar=("RUN", "DIR"), help="PyTorch Flight Recorder dumps, one per rank"
    )


def run(args: argparse.Namespace) -> int:
    from collector.tools.export import main as export_main

    return export_main(args)
