"""`rankscope` command line.

Every command that reads or writes data takes ``--data-dir`` (default
``./rankscope-data``). Commands that need torch (the demo's training run,
nvme-tune) run it in a child process, so this module imports neither torch
nor the trainer: the collector side stays light.

Each command is a module of collector/tools/commands (its flags, help, examples and run
function); this module puts them together under one parser and runs the one asked for.
"""

from __future__ import annotations

import argparse
import os
import sys

from collector.tools.commands import (
    calibrate,
    collect,
    dashboard,
    demo,
    export,
    fr,
    health,
    ingest,
    nvme_tune,
    probe,
    profile,
    replay,
    simulate,
    sql,
    stacks,
    whatif,
)
from collector.tools.commands.common import examples

# in the order `rankscope --help` lists them
COMMANDS = (
    collect,
    dashboard,
    demo,
    sql,
    ingest,
    replay,
    export,
    health,
    fr,
    whatif,
    profile,
    stacks,
    probe,
    simulate,
    calibrate,
    nvme_tune,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rankscope",
        description="Live observability for distributed PyTorch training.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=examples("""
            rankscope demo                      # collector + live 4-rank run + dashboard
            rankscope collect --port 50051      # run the collector
            rankscope dashboard --data-dir sample_runs
            rankscope sql "select op, count(*) from comm group by op"
        """),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        p = sub.add_parser(
            command.NAME,
            help=command.HELP,
            description=command.HELP,
            epilog=examples(command.EXAMPLES),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(func=command.run)
        command.add_arguments(p)
    return parser


EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell tool killed by a closed pipe reports


def _stdout_gone() -> int:
    """The reader of stdout went away (``rankscope health RUN | head``): stop quietly. What is
    still buffered can never be delivered; pointing stdout at /dev/null keeps the interpreter's
    exit-time flush from printing a second BrokenPipeError."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout already closed or not a file: nothing left to flush
        pass
    return EXIT_BROKEN_PIPE


def main(argv: list[str] | None = None) -> int:
    """Every command's entry: a closed stdout (a pipe into ``head``) ends the command quietly,
    whichever command was printing; Ctrl-C exits 130 without a traceback."""
    try:
        args = build_parser().parse_args(argv)
        rc = int(args.func(args) or 0)
        sys.stdout.flush()  # a small output is still buffered: a closed pipe shows up here
        return rc
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _stdout_gone()


if __name__ == "__main__":
    sys.exit(main())
