"""Real DeepSpeed 0.19.8 (the benchmarks' DeepSpeed venv), ZeRO-2 with fp16 and csv_monitor on 2 CPU
ranks under torchrun, ``hook.attach()`` the only rankscope line in the script: steps follow
DeepSpeed's ``global_steps`` (overflow-skipped steps included), DeepSpeed's monitor events are in
``monitor`` exactly as its csv_monitor wrote them, and every loss-scale decision is in ``loss_scale``.

Skips, saying why, where the venv cannot be made (no network to install DeepSpeed)."""

from __future__ import annotations

import csv
import itertools
import json
import subprocess
from pathlib import Path

import pytest

from collector.data import catalog
from collector.testing import flight_recorder
from collector.testing.collectors import live_collector
from collector.testing.ports import free_port

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "_deepspeed_hook_script.py"
WORLD, STEPS, GLOBAL_BATCH = 2, 8, 2 * 2 * 2  # ranks x micro batch x accumulation

pytestmark = pytest.mark.timeout(2400)  # the first run on a machine creates the DeepSpeed venv (pip, minutes)


def _run(out: Path, stage: int):
    """The script on WORLD ranks at ZeRO ``stage`` into a live collector, Flight Recorder on:
    (catalog connection, run id, what each rank wrote, out)."""
    from benches import _deepspeed_venv as venv

    try:
        env = venv.ensure_rank_side()
    except (subprocess.SubprocessError, OSError, RuntimeError) as exc:
        pytest.skip(f"no DeepSpeed venv ({venv.VENV}) and it cannot be made here: {exc}")
    with live_collector(out / "data") as (endpoint, data_dir):
        env["RANKSCOPE_ENDPOINT"] = endpoint
        env["RANKSCOPE_TEST_ZERO_STAGE"] = str(stage)
        env["TORCH_FR_BUFFER_SIZE"] = "20000"  # Flight Recorder: the oracle of collective identity
        torchrun = [str(venv.VENV / "bin" / "torchrun"), "--nproc-per-node", str(WORLD)]
        done = subprocess.run(
            [*torchrun, "--master-port", str(free_port()), str(SCRIPT), str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    run_id = ranks[0]["run_id"]
    assert all(r["run_id"] == run_id for r in ranks)
    return catalog.connect(data_dir), run_id, ranks, out


@pytest.fixture(scope="module")
def ds_run(tmp_path_factory):
    con, *rest = _run(tmp_path_factory.mktemp("ds_zero2"), stage=2)
    yield con, *rest
    con.close()


def test_steps_follow_deepspeeds_global_steps(ds_run):
    con, run_id, ranks, _ = ds_run
    for rank, seen in enumerate(ranks):
        global_steps = [s["global_steps"] for s in seen["after_steps"]]
        assert global_steps == list(range(1, STEPS + 1))
        comm_steps = con.execute(
            "SELECT DISTINCT step FROM comm WHERE run_id = ? AND rank = ? ORDER BY step", [run_id, rank]
        ).fetchall()
        assert [s for (s,) in comm_steps] == global_steps


def test_loss_scale_decisions_are_captured(ds_run):
    con, run_id, ranks, _ = ds_run
    for rank, seen in enumerate(ranks):
        rows = con.execute(
            "SELECT step, scale_before, scale, overflow FROM loss_scale WHERE run_id = ? AND rank = ? ORDER BY step",
            [run_id, rank],
        ).fetchall()
        assert [r[0] for r in rows] == list(range(1, STEPS + 1))  # one decision per step
        skipped = seen["after_steps"][-1]["skipped_steps"]
        assert 0 < skipped < STEPS  # the run overflowed at first, then trained
        assert sum(r[3] for r in rows) == skipped
        assert rows[0][1] == 2.0**24
        for (_, _, scale, _), (_, next_before, _, _) in itertools.pairwise(rows):
            assert next_before == scale  # each decision starts where the last one left off
        for _, before, scale, overflow in rows:
            assert scale == (before / 2 if overflow else before)  # hysteresis 1, window 1000: halve on overflow


def test_monitor_rows_match_deepspeeds_csv_monitor(ds_run):
    con, run_id, _, out = ds_run
    files = sorted((out / "csv" / "job").glob("*.csv"))
    assert {f.stem for f in files} >= {"Train_Samples_lr", "Train_Samples_loss_scale"}
    rows = con.execute(
        "SELECT tag, samples, value, step FROM monitor WHERE run_id = ? AND rank = 0 ORDER BY tag, samples", [run_id]
    ).fetchall()
    by_file: dict[str, list] = {}
    for tag, samples, value, step in rows:
        by_file.setdefault(tag.replace("/", "_").replace(" ", "_"), []).append((samples, value))
        assert step == samples // GLOBAL_BATCH  # written during the step whose samples it counts
    assert set(by_file) == {f.stem for f in files}
    for f in files:
        with f.open() as fh:
            written = [(int(r[0]), float(r[1])) for r in list(csv.reader(fh))[1:]]
        got = by_file[f.stem]
        assert [x for x, _ in got] == [x for x, _ in written], f.stem
        assert [v for _, v in got] == pytest.approx([v for _, v in written], rel=1e-6), f.stem
    assert con.execute("SELECT count(*) FROM monitor WHERE run_id = ? AND rank = 1", [run_id]).fetchone() == (0,)


def test_the_wait_between_steps_starts_at_deepspeeds_step_end(ds_run):
    """``engine.step()`` at a boundary ends the step (its ``global_steps``), the engine's next
    forward (DeepSpeedEngine is the outermost module) ends the wait: one row per step but the
    first; the micro-batch between two boundaries is inside the step, not a wait."""
    con, run_id, _, _ = ds_run
    rows = con.execute(
        "SELECT rank, step, dur_ns FROM between_steps WHERE run_id = ? ORDER BY rank, step", [run_id]
    ).fetchall()
    assert [(r, s) for r, s, _ in rows] == [(r, s) for r in range(WORLD) for s in range(2, STEPS + 1)], rows
    assert all(0 <= d < 10**9 for *_, d in rows), rows


def _assert_every_collective_is_flight_recorders(con, run_id: str, out: Path) -> None:
    for rank in range(WORLD):
        cur = con.execute("SELECT group_name, seq, op, numel FROM comm WHERE run_id = ? AND rank = ?", [run_id, rank])
        rows = [dict(zip(("group_name", "seq", "op", "numel"), r, strict=True)) for r in cur.fetchall()]
        assert rows and flight_recorder.mismatches(rows, flight_recorder.load(out, rank)) == [], rank


def test_every_collective_is_flight_recorders_entry_at_the_same_seq(ds_run):
    """DeepSpeed's ZeRO-2 collectives (through deepspeed.comm: reduce_scatter / all_gather of
    partitions, its overflow all_reduce, its own start-up broadcasts) equal torch's Flight
    Recorder entries at the same (process group, collective_seq_id) on every rank."""
    con, run_id, _, out = ds_run
    _assert_every_collective_is_flight_recorders(con, run_id, out)


def test_zero3_collectives_are_flight_recorders_entries_too(tmp_path):
    """ZeRO-3 adds the parameter all_gathers of every forward and backward (issued from its
    prefetch/fetch hooks) and the partitioned gradients' reduce_scatter: the same check."""
    con, run_id, _, out = _run(tmp_path, stage=3)
    try:
        ops = {op for (op,) in con.execute("SELECT DISTINCT op FROM comm WHERE run_id = ?", [run_id]).fetchall()}
        assert any("all_gather" in op for op in ops), ops  # ZeRO-3's parameter gathers are there
        _assert_every_collective_is_flight_recorders(con, run_id, out)
    finally:
        con.close()
