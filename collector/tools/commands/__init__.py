"""The ``rankscope`` subcommands, one module each (collector/tools/cli.py assembles them).

A command module declares ``NAME``, ``HELP`` (one line: the subcommand's help and description),
``EXAMPLES`` (shown under "examples:" in its --help), ``add_arguments(parser)`` and
``run(args) -> exit code``. It imports only what parsing needs; ``run`` imports the work (its own
module under collector/tools/, the server), so ``rankscope --help`` and a collector load nothing
another command uses. Options several commands share are in ``common``.
"""
