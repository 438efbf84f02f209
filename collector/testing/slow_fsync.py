"""``rankscope collect`` on a disk whose every fsync takes 0.2-2 s, as on a network filesystem that
stalls: the collector process's ``os.fsync`` sleeps a seeded uniform(MIN, MAX) s before the real one
(the test moves the collector's view of its disk; everything else is the real collector).

    python -m collector.testing.slow_fsync MIN MAX SEED collect --data-dir D --port 0 ...

collector.testing.slow_dir is the real thing where FUSE is available (a directory whose fsyncs
sleep, for every process that writes there); this one needs nothing and slows the fsync alone.
"""

from __future__ import annotations

import os
import random
import runpy
import sys
import time


def main(argv: list[str]) -> None:
    low, high, seed, *rest = argv
    real, rng = os.fsync, random.Random(int(seed))

    def slow_fsync(fd):
        time.sleep(rng.uniform(float(low), float(high)))
        return real(fd)

    os.fsync = slow_fsync
    sys.argv = ["rankscope", *rest]
    runpy.run_module("collector.tools.cli", run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
