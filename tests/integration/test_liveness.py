"""Hangs, collective mismatches and silent ranks, live: 4 real gloo ranks with the hook
attached, a real collector, the catalog's views, ``rankscope health`` and the rank's stacks.

Timing: the hang must be visible within ``hang_after_s + 3`` s of the waiting ranks entering
the collective; other waits are generous (the machine is shared), never tight."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from collector.data import findings, queries
from collector.testing.collectors import live_collector
from collector.testing.ports import free_port
from tests.integration import _liveness_workers as workers

HANG_AFTER_S = 2.0
K = 6  # the all_reduce rank 2 stalls before
STALL_S = 14.0  # long enough to look at the hang, short enough for the suite (the 60 s is the same story)


def _spawn(fn, endpoint: str, out: Path, *args):
    return mp.start_processes(
        fn, args=(free_port(), endpoint, str(out), *args), nprocs=workers.WORLD, join=False, start_method="spawn"
    )


def _join(ctx, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise AssertionError("ranks did not finish")


def _wait(predicate, timeout: float, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got is not None and got is not False:
            return got
        time.sleep(interval)
    return predicate()


def _query(data_dir, fn, *args):
    """fn(cat, run_id, *args) on the data dir's only run; None before the run exists."""
    try:
        cat = queries.Catalog(data_dir)
    except queries.DataDirError:
        return None
    try:
        runs = queries.list_runs(cat)
        if runs.empty:
            return None
        return fn(cat, runs.run_id.iloc[0], *args)
    finally:
        cat.close()


def _health(data_dir) -> subprocess.CompletedProcess:
    run_id = _query(data_dir, lambda cat, run_id: run_id)
    return subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", "health", run_id, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )


def _kinds(data_dir) -> set[str]:
    found = _query(data_dir, findings.for_run) or []
    return {f.kind for f in found if f.severity == "critical"}


def test_a_stalled_rank_is_a_hang_with_its_stack_and_the_run_then_finishes(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with live_collector(tmp_path / "data") as collector:
        ctx = _spawn(workers.hang_worker, collector.endpoint, out, K, 2, STALL_S)
        try:
            assert _wait(lambda: (out / "entered0").exists(), 120), "rank 0 never reached the k-th all_reduce"
            entered = min(float((out / f"entered{r}").read_text()) for r in (0, 1, 3) if (out / f"entered{r}").exists())

            def hung():
                frame = _query(collector.data_dir, queries.hangs)
                return frame if frame is not None and len(frame) else None

            frame = _wait(hung, HANG_AFTER_S + 3 + 5)
            seen_after = time.time() - entered
            assert frame is not None, "no hang reported"
            assert seen_after <= HANG_AFTER_S + 3, f"hang visible only {seen_after:.1f} s after entering"
            row = frame.iloc[0]
            assert (row.group_name, int(row.seq), row.op) == ("world", K, "all_reduce")
            assert list(row.waiting_ranks) == [0, 1, 3] and list(row.missing_ranks) == [2]
            assert [int(m["last_completed_seq"]) for m in row.missing] == [K - 1]

            health = _health(collector.data_dir)
            assert health.returncode == 2, health.stdout + health.stderr
            hang_lines = [line for line in health.stdout.splitlines() if "hang:" in line]
            assert len(hang_lines) == 1 and "waiting for rank 2" in hang_lines[0], health.stdout

            def rank2_main_stack():
                st = _query(collector.data_dir, queries.stacks, [2])
                if st is None or st.empty:
                    return None
                main = st[st.is_main]
                return main.iloc[0] if len(main) else None

            stack = _wait(rank2_main_stack, 15)
            assert stack is not None, "rank 2 was not asked for (or did not send) its stacks"
            assert "stall_before_collective" in stack.stack and "_liveness_workers.py" in stack.stack
            assert "in stall_before_collective" in stack.innermost or "in sleep" in stack.innermost
            assert stack.reason.startswith("missing from all_reduce #6 of world")
            # the waiting ranks captured their own stacks when the hang began: inside all_reduce
            waiting = _query(collector.data_dir, queries.stacks, [0])
            assert any("all_reduce" in s for s in waiting[waiting.is_main]["stack"])
        finally:
            _join(ctx)
        # The captures did not disturb the sleeping rank: the run went on and finished.
        results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(workers.WORLD)]
        assert all(r["total"] == 4 * 4 * (K + 1) for r in results)
    assert _query(tmp_path / "data", queries.hangs).empty
    runs = _query(tmp_path / "data", lambda cat, run_id: queries.list_runs(cat))
    assert runs.status.iloc[0] == "finished"
