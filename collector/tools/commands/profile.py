"""``rankscope profile``: its flags (``ask_arguments`` also ``stacks``'); the requests and the
diff are collector/tools/profile.py."""

from __future__ import annotations

import argparse

from collector.tools.commands.common import data_dir_arg, endpoint_arg, resolve_endpoint, tls_ca_arg

NAME = "profile"
HELP = "Profile ranks of a live run over their next steps (torch.profiler, Python stacks) and diff them."
EXAMPLES = """
    rankscope profile demo --ranks 1 --reference 0 --steps 3 --out /tmp/evidence
    rankscope profile bert-large --ranks 3,517 --steps 3 --endpoint collector:50051 --data-dir /scratch/rs
"""


def ask_arguments(p: argparse.ArgumentParser) -> None:
    """Which run and ranks to ask, through which collector, and how long to wait for the answers."""
    data_dir_arg(p)
    p.add_argument("run", metavar="RUN", help="run id, or run name (resolved in --data-dir where readable)")
    p.add_argument("--ranks", required=True, metavar="R[,R-R]", help="ranks to ask: 3,517 or 0-3")
    endpoint_arg(p)
    p.add_argument("--token", default=None, help="the collector's bearer token (default: $RANKSCOPE_TOKEN)")
    tls_ca_arg(p)
    p.add_argument(
        "--wait", type=float, default=120.0, metavar="S", help="wait S s for the answers in --data-dir (0: do not)"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    ask_arguments(p)
    p.add_argument("--steps", type=int, default=3, help="steps to profile, 1-20 (default 3)")
    p.add_argument("--reference", type=int, default=None, metavar="R", help="the healthy rank to diff against")
    p.add_argument("--record-shapes", action="store_true", help="torch.profiler's record_shapes")
    p.add_argument("--out", default=None, metavar="DIR", help="write rank<R>.json and merged.json here")


def run(args: argparse.Namespace) -> int:
    from collector.tools.profile import main as profile_main

    resolve_endpoint(args, NAME)
    return profile_main(args, NAME)
