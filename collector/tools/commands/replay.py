"""``rankscope replay``: its flags; the replay is collector/tools/replay.py."""

from __future__ import annotations

import argparse

from collector.tools.commands.common import DEFAULT_DATA_DIR, endpoint_arg, resolve_endpoint, tls_ca_arg

NAME = "replay"
HELP = "Re-stream an archived run through a live collector as a new, linked run."
EXAMPLES = """
    rankscope replay run.rsarchive --speed 10           # 10x real time into the collector of ./rankscope-data
    rankscope replay rankscope-data --run bert-large --speed 0 --endpoint 10.0.0.5:50051
    rankscope replay sample_runs/parquet/comm/run=demo-20260101-000000-abc123
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path", help="an archive (rankscope export --archive), a data dir (with --run), or a run=<id> folder inside one"
    )
    p.add_argument("--run", default=None, help="run id or name, when PATH is a data dir")
    p.add_argument("--speed", type=float, default=1.0, help="times real time (default 1; 0 = as fast as possible)")
    endpoint_arg(p, what="the collector to stream into")
    p.add_argument(
        "--data-dir",
        default=DEFAULT_DATA_DIR,
        metavar="D",
        help=f"find the collector to stream into from D/collector.json (default: ./{DEFAULT_DATA_DIR})",
    )
    p.add_argument("--token", default=None, help="bearer token (default: $RANKSCOPE_TOKEN)")
    tls_ca_arg(p)
    p.add_argument("--name", default=None, help="name of the new run (default: the original's + '-replay')")


def run(args: argparse.Namespace) -> int:
    from collector.tools.replay import main as replay_main

    resolve_endpoint(args, NAME)
    return replay_main(args)
