"""Small pieces every benchmark script needs: a process's CPU time and which code ran.
(Free ports, collectors, fake runs and the dashboard come from collector.testing.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User + system CPU the process has used so far."""
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def code_version(root) -> str:
    """Which rankscope code ran: the git commit (+ 'with local changes'), or $RANKSCOPE_BENCH_COMMIT
    for a snapshot exported with `git archive`."""
    if os.environ.get("RANKSCOPE_BENCH_COMMIT"):
        return f"commit {os.environ['RANKSCOPE_BENCH_COMMIT']} (clean snapshot: git archive)"
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "trainer", "collector"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return f"commit {head}" + (" with uncommitted changes in trainer/ or collector/" if dirty else "")


# The last commit whose collector is the sync grpc.server (a thread per stream, at most 256
# streams): the baseline of the collector benchmarks.
BASELINE_COLLECTOR_COMMIT = "58f49d5"


def baseline_tree(root, commit: str, into: Path) -> Path:
    """``commit`` of this repository exported to ``into`` with its gRPC stubs generated."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(root), "archive", commit], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "proto.generate"], cwd=into, check=True, capture_output=True)
    return into


def publish(out, text: str) -> None:
    """A bench's report: written to ``out`` (its RESULTS file) and printed."""
    Path(out).write_text(text)
    print(text)
