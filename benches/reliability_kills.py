"""Kill at every point, the full count (issue 49): 200 collector SIGKILLs and 50 rank SIGKILLs.

Target: 0 records lost or stored twice, 0 reader errors, 0 partial segments or spool files visible,
every restart clean (collector.testing.kill_harness says what each is).

Method: ``--collector-kills`` kills split over ``--dirs`` data dirs (a run each: 4 simulated ranks,
24 steps, 2 steps an envelope, every table); half the dirs run ``collect --raw-every 2`` so the kills
also land in retention's thinning. Each kill comes at a seeded uniform(0, ``--max-delay``) s after
the ranks begin (re)sending, or that long after everything was acked (compaction, rollup, retention
and their ledger commits then run); a reader reads every view and every manifest segment after each
kill; at the end each table's rows are counted against what was sent. ``--rank-kills`` kill spooling
ranks mid-write and resending ranks mid-resend alternately; every record of a complete spool file
must arrive once. Seeds make a run reproducible (the moments, not the machine's scheduling).

    .venv/bin/python -m benches.reliability_kills [--collector-kills 200] [--dirs 4] [--rank-kills 50] [--seed 49]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from benches._common import code_version
from collector.testing.kill_harness import kill_collectors, kill_ranks

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--collector-kills", type=int, default=200)
    p.add_argument("--dirs", type=int, default=4)
    p.add_argument("--rank-kills", type=int, default=50)
    p.add_argument("--max-delay", type=float, default=1.5)
    p.add_argument("--seed", type=int, default=49)
    a = p.parse_args(argv)
    lines, failed = [], False
    with tempfile.TemporaryDirectory(prefix="rankscope-kills-") as tmp:
        per_dir = a.collector_kills // a.dirs
        for d in range(a.dirs):
            raw_every = 2 if d % 2 else 0
            r = kill_collectors(
                Path(tmp) / f"data{d}",
                per_dir,
                a.seed + d,
                raw_every=raw_every,
                max_delay_s=a.max_delay,
                log=lambda m, d=d: print(f"dir {d}: {m}", file=sys.stderr, flush=True),
            )
            failed |= not r.ok
            lines.append(
                f"| collector, dir {d} (seed {a.seed + d}, raw_every {raw_every}) | {r.kills} | "
                f"{r.killed_with_unacked} | {r.resent_acked} | {r.rows_stored:,} / {r.rows_expected:,} | "
                f"{len(r.reader_errors)} | {len(r.partial_segments)} | {r.problems() or 'none'} | {r.seconds:.0f} s |"
            )
            print(lines[-1], flush=True)
        r = kill_ranks(Path(tmp) / "ranks", a.rank_kills, a.seed, log=lambda m: print(m, file=sys.stderr, flush=True))
        failed |= not r.ok
        lines.append(
            f"| ranks (seed {a.seed}): {(a.rank_kills + 1) // 2} mid-spool, {a.rank_kills // 2} mid-resend "
            f"| {r.kills} | - | - | {r.rows_stored:,} / {r.rows_expected:,} | {len(r.reader_errors)} | "
            f"{len(r.partial_segments)} | {r.problems() or 'none'} | {r.seconds:.0f} s |"
        )
        print(lines[-1], flush=True)
    load, when = os.getloadavg(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(
        f"\n{code_version(ROOT)}; {platform.node()}, {os.cpu_count()} cores, load {load[0]:.1f} / {load[1]:.1f} / "
        f"{load[2]:.1f} at the end; Python {platform.python_version()}; {when}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
