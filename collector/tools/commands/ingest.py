"""``rankscope import``: its flags; a one-off import is collector/tools/importers/ingest.py,
``--watch`` is collector/tools/watch.py."""

from __future__ import annotations

import argparse

from collector.tools.commands.common import data_dir_arg, tls_ca_arg

NAME = "import"
HELP = (
    "Import DeepSpeed outputs (csv_monitor, tensorboard, log_summary JSON, verbose "
    "comms log, flops profile, exported Parquet), PyTorch Flight Recorder dumps or torch.profiler "
    "traces as a new run, or watch a folder for them."
)
EXAMPLES = """
    rankscope import ds_logs/                       # a DeepSpeed output folder, into ./rankscope-data
    rankscope import comms_summary_rank0.json --run bert-large --data-dir /scratch/rs
    rankscope import flops_profile.txt --endpoint 127.0.0.1:50051   # through a running collector
    rankscope import profiler_traces/               # torch.profiler Chrome traces, one per rank
    rankscope import --watch incoming/ --run nightly  # ingest files (also spool files, archives) as they appear
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    data_dir_arg(p)
    p.add_argument("path", nargs="?", help="a file or a folder (searched recursively)")
    p.add_argument("--run", default=None, help="run name (default: the file or folder name)")
    p.add_argument(
        "--world-size", type=int, default=None, help="ranks of the job (default: from the files, else the ranks seen)"
    )
    p.add_argument(
        "--endpoint",
        default=None,
        help="send through the collector at HOST:PORT instead of writing --data-dir yourself",
    )
    p.add_argument("--token", default=None, help="bearer token for --endpoint (default: $RANKSCOPE_TOKEN)")
    tls_ca_arg(p)
    p.add_argument(
        "--watch",
        metavar="DIR",
        default=None,
        help="keep watching DIR and ingest every new file once, also across restarts",
    )
    p.add_argument(
        "--settle",
        type=float,
        default=1.0,
        help="watch: seconds a file must stay unchanged before it is ingested (default 1)",
    )
    p.add_argument("--once", action="store_true", help="watch: ingest what is there now and exit")


def run(args: argparse.Namespace) -> int:
    if args.watch:
        from collector.tools.watch import main as watch_main

        return watch_main(args)
    from collector.tools.importers.ingest import main as import_main

    return import_main(args)
