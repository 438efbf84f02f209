"""`rankscope import` of torch's Flight Recorder dumps (JSON and pickle) from a real 3-rank gloo
run with the hook attached to a real collector: a hang's dumps give the same ``hangs`` row
(op, seq, waiting and missing ranks) as the hook's live records of the same run, and
``rankscope health`` names it; a healthy run's dumps give the hook's completed collectives
(group, seq, op) and no hang or desync. Bad dumps are named, never executed.

Split by tier: the pure-function tests are in tests/unit/tools/test_import_flight_recorder.py."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from collector.data import queries
from collector.testing.collectors import live_collector
from collector.testing.gloo import start_ranks
from tests._import_util import on_the_run, only_run, query, rankscope
from tests.integration.tools import _fr_workers as workers
from tests.integration.tools.test_export_flight_recorder import analyzer_verdicts

K = 4  # the step whose all_reduce rank 2 never enters
STALL_RANK = 2


def _run(tmp_path, stall_rank: int):
    """(the live data dir, the dumps folder, the hook's hangs rows while the ranks waited)."""
    out = tmp_path / "out"
    (out / "dumps").mkdir(parents=True)
    data = tmp_path / "live"
    live_hangs = None
    with live_collector(data) as collector:
        ctx = start_ranks(workers.worker, workers.WORLD, collector.endpoint, str(out), K, stall_rank)
        deadline = time.monotonic() + 180
        while not ctx.join(timeout=0.5):
            if stall_rank >= 0 and live_hangs is None:
                live_hangs = _live_hangs(collector.data_dir)
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise AssertionError("the ranks did not finish")
    return data, out / "dumps", live_hangs


def _live_hangs(data_dir):
    """The hangs rows once both waiting ranks' reports have landed, else None."""
    frame = on_the_run(data_dir, queries.hangs)
    if frame is None or frame.empty or len(frame.iloc[0].waiting_ranks) < workers.WORLD - 1:
        return None
    return _hang_rows(frame.itertuples())


def _hang_rows(rows) -> list[tuple]:
    return [(r.group_name, int(r.seq), r.op, list(r.waiting_ranks), list(r.missing_ranks)) for r in rows]


def test_a_hangs_dumps_give_the_hang_the_hook_recorded_live(tmp_path):
    data, dumps, live = _run(tmp_path, STALL_RANK)
    assert live, "the hook's records never showed the hang while the ranks waited"
    assert [(w, m) for *_, w, m in live] == [([0, 1], [STALL_RANK])]
    assert sorted(p.name for p in dumps.iterdir()) == ["fr0.json", "fr2.json", "nccl_trace_rank_1"]
    imported = tmp_path / "imported"
    assert rankscope("import", dumps, "--data-dir", imported) == 0
    run_id = only_run(imported)
    cat = queries.Catalog(imported)
    try:
        assert _hang_rows(queries.hangs(cat, run_id).itertuples()) == live
    finally:
        cat.close()
    # the collectives before the hang: completed on every rank, the hook's (rank, seq, op, numel)
    sql = "SELECT rank, seq, op, numel FROM comm WHERE op = 'all_reduce'"
    assert sorted(query(imported, sql)) == sorted(query(data, sql)) and len(query(data, sql)) == workers.WORLD * (K - 1)
    stacks = query(imported, "SELECT rank, reason, stack FROM stacks WHERE run_id = ?", [run_id])
    assert {r for r, *_ in stacks} <= {0, 1} and any("all_reduce" in s for *_, s in stacks)
    # and back out: torch's analyzer reads our export of the imported run with the same verdict
    assert rankscope("export", "--flight-recorder", run_id, tmp_path / "fr", "--data-dir", imported) == 0
    assert analyzer_verdicts(tmp_path / "fr") == [(seq, missing) for _, seq, _, _, missing in live]
    health = subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", "health", run_id, "--data-dir", str(imported)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert health.returncode == 2, health.stdout + health.stderr
    assert f"waiting for rank {STALL_RANK}" in health.stdout


@pytest.mark.slow  # ~20 s; the hang test above checks the completed collectives of its run too
def test_a_healthy_runs_dumps_give_the_hooks_collectives_and_no_hang(tmp_path):
    live, dumps, _ = _run(tmp_path, -1)
    imported = tmp_path / "imported"
    assert rankscope("import", dumps, "--data-dir", imported) == 0
    run_id = only_run(imported)
    got = query(imported, "SELECT rank, seq, op, numel FROM comm WHERE run_id = ? AND op = 'all_reduce'", [run_id])
    hook_rows = query(live, "SELECT rank, seq, op, numel FROM comm WHERE group_name = 'world' AND op = 'all_reduce'")
    assert sorted(got) == sorted(hook_rows) and len(got) == workers.WORLD * K
    # all_gather_into_tensor runs as gloo's all_gather: the same instance (seq), its gathered size
    gathers = query(imported, "SELECT rank, seq, numel FROM comm WHERE run_id = ? AND op = 'all_gather'", [run_id])
    hook_gathers = query(live, "SELECT rank, seq, numel FROM comm WHERE op = 'all_gather_into_tensor'")
    first = min(seq for _, seq, _ in hook_gathers)  # before it: the session's own set-up exchange, not recorded
    assert (
        sorted(g for g in gathers if g[1] >= first) == sorted(hook_gathers) and len(hook_gathers) == workers.WORLD * K
    )
    assert query(imported, "SELECT count(*) FROM hangs")[0][0] == 0
    assert query(imported, "SELECT count(*) FROM desyncs")[0][0] == 0
    assert query(imported, "SELECT DISTINCT status FROM runs") == [("finished",)]
