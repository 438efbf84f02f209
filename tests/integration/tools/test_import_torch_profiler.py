"""`rankscope import` of torch.profiler traces from a real 2-rank gloo DDP run that had the hook
attached to a real collector at the same time (tests/integration/tools/_profiler_workers.py):
the traces' comm rows are the hook's rows of the profiled steps -- the same (step, op, dtype,
numel, bytes) per rank, the same instances across ranks -- and their durations are the hook's
within tolerance; the step timers make the Stragglers analysis measure every profiled step.
A trace cut short keeps the rows before the cut and says where it broke; a file that is no
trace is named.

Duration tolerance: the trace times a collective from its ``c10d::`` op's start to its gloo
worker event's end; the hook from just before the Python call (a few µs earlier: the
torch.distributed wrapper) to its completion as the hook's callback or wait() sees it (a few µs
later). On these sub-millisecond gloo collectives that few-µs difference is most of any gap,
so the per-(op, size) medians are compared within 5% or 50 µs, whichever is larger; the
measured gaps are printed (pytest -s)."""

from __future__ import annotations

import shutil
import statistics

import pytest

from collector.data import queries
from collector.testing.collectors import live_collector
from collector.testing.gloo import join_ranks, start_ranks
from tests._import_util import only_run, query, rankscope
from tests.integration.tools import _profiler_workers as workers

REL_TOL, ABS_TOL_NS = 0.05, 50_000
PROFILED = tuple(range(workers.FIRST_STEP, workers.ITERATIONS + 1))
ROWS = "SELECT rank, step, op, dtype, numel, bytes FROM comm WHERE run_id = ? AND step BETWEEN ? AND ?"
TIMES = "SELECT rank, step, op, bytes, start_ns, end_ns FROM comm WHERE run_id = ? AND step BETWEEN ? AND ?"
TIMES += " ORDER BY start_ns"


def _paired(live, hook_run, imported, run) -> list[tuple[tuple, tuple]]:
    """((hook start, end), (trace start, end)) of each profiled collective: the k-th of a
    (rank, step, op, bytes) in the hook's rows with the k-th in the trace's."""
    sides = []
    for data, run_id in ((live, hook_run), (imported, run)):
        by = {}
        for rank, step, op, nbytes, start, end in query(data, TIMES, [run_id, PROFILED[0], PROFILED[-1]]):
            by.setdefault((rank, step, op, nbytes), []).append((start, end))
        sides.append(by)
    hook, trace = sides
    assert hook.keys() == trace.keys()
    return [pair for key in hook for pair in zip(hook[key], trace[key], strict=True)]


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory):
    """(the traces folder, the hook's data dir) of one profiled run."""
    tmp = tmp_path_factory.mktemp("profiled")
    traces = tmp / "traces"
    traces.mkdir()
    with live_collector(tmp / "live") as collector:
        join_ranks(start_ranks(workers.worker, workers.WORLD, collector.endpoint, str(traces)), timeout=180)
    return traces, tmp / "live"


def test_profiler_traces_import_as_the_hook_recorded_the_same_run(profiled_run, tmp_path):
    traces, live = profiled_run
    files = sorted(p.name for p in traces.iterdir())
    assert len(files) == 2 and any(f.endswith(".pt.trace.json.gz") for f in files), files
    imported = tmp_path / "imported"
    assert rankscope("import", traces, "--data-dir", imported) == 0
    run, hook_run = only_run(imported), only_run(live)
    steps = (PROFILED[0], PROFILED[-1])

    got = sorted(query(imported, ROWS, [run, *steps]))
    want = sorted(query(live, ROWS, [hook_run, *steps]))
    assert got == want
    sizes = {(op, nbytes) for _, _, op, _, _, nbytes in want}
    assert len(sizes) >= 3 and len(want) >= workers.WORLD * len(PROFILED) * 3  # buckets and the loss
    # nothing else came in, and every instance is the same collective on both ranks
    assert query(imported, "SELECT count(*) FROM comm")[0][0] == len(got)
    per_seq = query(imported, "SELECT seq, count(DISTINCT rank), count(DISTINCT bytes) FROM comm GROUP BY seq")
    assert {(n, b) for _, n, b in per_seq} == {(2, 1)}

    # the same collectives, paired: each imported interval has a positive length and lies where the
    # hook's does (both clocks are this host's; the trace starts a few µs after the hook, in c10d)
    for hook_row, row in _paired(live, hook_run, imported, run):
        assert row[1] > row[0] and abs(row[0] - hook_row[0]) < 2_000_000, (hook_row, row)

    # step timing: the Stragglers analysis measures each profiled step on each rank, from the timers
    cat = queries.Catalog(imported)
    try:
        analysis = queries.step_analysis(cat, run)
    finally:
        cat.close()
    assert sorted(set(analysis.step)) == list(PROFILED) and set(analysis["rank"]) == {0, 1}
    assert analysis.timed.all() and (analysis.step_ms > 0).all() and (analysis.comm_ms <= analysis.step_ms).all()


def test_a_trace_cut_short_keeps_what_came_before_and_says_where(profiled_run, tmp_path, capsys):
    """Rank 0's trace cut at 60% of its bytes (a rank killed while writing), beside a file that is
    no trace: both named, and the cut trace's rows before the cut imported."""
    traces, _ = profiled_run
    whole = next(p for p in traces.iterdir() if p.name.endswith(".json"))
    data = whole.read_bytes()
    cut = tmp_path / "in" / "rank0.pt.trace.json"
    cut.parent.mkdir()
    cut.write_bytes(data[: len(data) * 6 // 10])
    (tmp_path / "in" / "rank1.pt.trace.json").write_text('{"traceEvents": [{"ph": "X", "name": ')
    shutil.copy(whole, tmp_path / "whole.json")
    assert rankscope("import", tmp_path / "whole.json", "--data-dir", tmp_path / "whole") == 0
    capsys.readouterr()
    assert rankscope("import", tmp_path / "in", "--data-dir", tmp_path / "imported") == 1
    err = capsys.readouterr().err
    assert f"{cut}:byte " in err and "the trace breaks off here" in err, err
    sql = "SELECT step, seq, op, numel, start_ns FROM comm WHERE rank = 0 ORDER BY seq"
    kept, full = query(tmp_path / "imported", sql), query(tmp_path / "whole", sql)
    assert 0 < len(kept) <= len(full) and kept == full[: len(kept)]
    assert query(tmp_path / "imported", "SELECT count(*) FROM comm WHERE end_ns IS NOT NULL")[0][0] == 0
    assert query(tmp_path / "imported", "SELECT count(*) FROM timers WHERE name = 'profiler_step'")[0][0] >= 1


@pytest.mark.timing
def test_profiler_durations_are_the_hooks(profiled_run, tmp_path):
    """Per collective, the trace's duration against the hook's for the same instance: the median
    gap within 5% of the hook's duration or 50 µs; the per-(op, size) medians printed (-s)."""
    traces, live = profiled_run
    imported = tmp_path / "imported"
    assert rankscope("import", traces, "--data-dir", imported) == 0
    pairs = _paired(live, only_run(live), imported, only_run(imported))
    gaps = [((te - ts) - (he - hs), he - hs) for (hs, he), (ts, te) in pairs]
    within = [abs(gap) <= max(REL_TOL * dur, ABS_TOL_NS) for gap, dur in gaps]
    rel = sorted(abs(gap) / dur for gap, dur in gaps)
    print(
        f"{len(gaps)} collectives: {sum(within)} within max(5%, 50 µs) of the hook's duration; "
        f"|gap|/duration median {statistics.median(rel):.1%}, p90 {rel[int(0.9 * (len(rel) - 1))]:.1%}, "
        f"max {rel[-1]:.1%}; |gap| max {max(abs(g) for g, _ in gaps) / 1e3:.0f} µs"
    )
    assert sum(within) * 2 >= len(within)
