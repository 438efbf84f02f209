"""`make bench`: run every benchmark module in benches/ one after another.

Each module is a script (`python -m benches.NAME`) that prints its figures and
writes benches/RESULTS-<area>.md; BENCHMARKS.md collects them. Pass names to
run a subset: `python -m benches.run ingest hook_overhead`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def bench_modules() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.py") if not p.stem.startswith("_") and p.stem not in ("run", "assemble"))


def main(argv: list[str]) -> int:
    names = argv or bench_modules()
    unknown = sorted(set(names) - set(bench_modules()))
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(bench_modules())}", file=sys.stderr)
        return 2
    failed = []
    for i, name in enumerate(names, 1):
        print(f"\n=== [{i}/{len(names)}] benches.{name} ===", flush=True)
        t0 = time.monotonic()
        rc = subprocess.call([sys.executable, "-m", f"benches.{name}"])
        print(f"=== benches.{name}: exit {rc} in {time.monotonic() - t0:.0f}s ===", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    subprocess.call([sys.executable, "-m", "benches.assemble"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
