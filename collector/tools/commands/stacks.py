"""``rankscope stacks``: its flags are ``profile``'s questions (which run, ranks, collector);
the request is collector/tools/profile.py's."""

from __future__ import annotations

import argparse

from collector.tools.commands.common import resolve_endpoint
from collector.tools.commands.profile import ask_arguments

NAME = "stacks"
HELP = "Ask ranks of a live run for every Python thread's stack, and print the innermost frames."
EXAMPLES = """
    rankscope stacks demo --ranks 1-3
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    ask_arguments(p)


def run(args: argparse.Namespace) -> int:
    from collector.tools.profile import main as profile_main

    resolve_endpoint(args, NAME)
    return profile_main(args, NAME)
