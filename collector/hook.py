"""The documented entry for instrumenting an existing script: ``from collector import hook;
hook.attach()``, or ``python -m collector.hook train.py``. It is collector.rank.hook."""

import sys

from collector.rank.hook import attach, attached, ddp_comm_hook, detach, is_attached, log, main, step

__all__ = ["attach", "attached", "ddp_comm_hook", "detach", "is_attached", "log", "main", "step"]

if __name__ == "__main__":
    sys.exit(main())
