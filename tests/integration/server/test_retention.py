"""Retention in a live collector (`collect --raw-every N`): a simulated run streamed into a
collector that thins out raw comm records keeps every Nth step raw plus the steps with
findings, the per-step rollup for every step, and the Stragglers/Comms queries and
`rankscope health` agree with the same run kept fully raw (within 5%), saying where they
read rollups.

Split by tier: the pure-function tests are in tests/unit/server/test_retention.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from collector.data import catalog, findings, queries
from collector.server.compaction import CompactionConfig
from collector.testing.collectors import live_collector
from collector.tools import simulate
from tests.unit.server.test_retention import query

RANKS, STEPS, EVERY, LATE_FROM = 32, 60, 10, 45
SIM = simulate.Simulation(
    ranks=RANKS, steps=STEPS, stragglers=(simulate.Straggler(5, 40_000_000, LATE_FROM),), run_id="kept"
)
RETAIN = CompactionConfig(interval=3600, raw_every=EVERY, retention_window=20)  # passes: compact_until


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    full = tmp_path_factory.mktemp("full")
    simulate.write_data_dir(SIM, full)
    thinned = tmp_path_factory.mktemp("thinned") / "data"
    with live_collector(thinned, compaction_config=RETAIN) as collector:
        simulate.stream(SIM, collector.endpoint, streams=RANKS)
        retention = collector.state.compactor.retention
        # done_through moves once a window's rollup *and* thinning are committed
        collector.compact_until(
            lambda: retention.done_through.get(SIM.run_id, -1) >= STEPS - 1, "the run's rollup and thinning"
        )
    catalog.ensure_catalog(thinned)
    return full, thinned


def test_raw_rows_kept_for_the_sample_and_the_late_steps_rollup_for_every_step(dirs):
    _, thinned = dirs
    con = catalog.connect(str(thinned))
    raw_steps = {s for (s,) in con.execute("SELECT DISTINCT step FROM comm").fetchall()}
    assert raw_steps == set(range(0, STEPS, EVERY)) | set(range(LATE_FROM, STEPS))
    per_step = con.execute("SELECT count(DISTINCT step), count(DISTINCT rank) FROM comm_steps").fetchone()
    assert per_step == (STEPS, RANKS)
    (n,) = con.execute("SELECT sum(n) FROM comm_steps").fetchone()
    assert n == RANKS * STEPS * SIM.per_step  # every raw record is counted once in the rollup
    (raw,) = con.execute("SELECT count(*) FROM comm").fetchone()
    assert raw == RANKS * SIM.per_step * len(raw_steps)
    con.close()
    state = query(thinned, queries.retention, SIM.run_id)
    assert state == {"through": STEPS - 1, "steps": STEPS, "raw_steps": len(raw_steps)}
    assert query(dirs[0], queries.retention, SIM.run_id) is None


def test_pages_agree_with_the_full_raw_run(dirs):
    full, thinned = dirs
    a, b = (query(d, queries.comm_rollup, SIM.run_id) for d in (full, thinned))
    everything = queries.CommFilter()
    for name in ("last_arrivals", "delay_heatmap", "log_summary", "bandwidth_by_step", "comm_by_rank"):
        fa, fb = (getattr(queries, name)(r, everything) for r in (a, b))
        assert len(fa) == len(fb), name
        numeric = [c for c in fa.columns if fa[c].dtype.kind in "fi"]
        for col in numeric:
            assert fb[col].to_numpy() == pytest.approx(fa[col].to_numpy(), rel=0.05, abs=1e-9, nan_ok=True), (
                f"{name}.{col}"
            )
    fa, fb = (query(d, findings.for_run, SIM.run_id) for d in (full, thinned))
    # The notes on communication shares need the raw intervals (unions within a step), so they are
    # taken over the raw steps kept, which lean towards steps with findings: only warnings must agree.
    assert [f.text for f in fa if f.severity != "info"] == [f.text for f in fb if f.severity != "info"]
    assert any(f.kind == "straggler" and f.ranks == (5,) for f in fb)


def test_health_says_it_read_rollups(dirs):
    _, thinned = dirs
    out = subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", "health", SIM.run_id, "--data-dir", str(thinned)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert "rank 5 costs" in out.stdout
    assert f"steps 0–{STEPS - 1} read from per-step rollups" in out.stdout


def test_raw_every_with_a_writer_id_is_refused(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", "collect", "--data-dir", str(tmp_path), "--raw-every", "10",
         "--writer-id", "c0", "--port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "--raw-every" in out.stderr and "--writer-id" in out.stderr


@pytest.mark.parametrize("page", ["views/stragglers.py", "views/comms.py"])
def test_pages_say_they_read_rollups(dirs, monkeypatch, page):
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("RANKSCOPE_DATA_DIR", str(dirs[1]))
    at = AppTest.from_file(str(Path(__file__).resolve().parents[3] / "app" / "main.py"), default_timeout=60)
    at.session_state["selected_runs"] = [SIM.run_id]
    at.run()
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    notes = "\n".join(str(i.value) for i in at.info)
    assert f"Retention: steps 0–{STEPS - 1} read from per-step rollups" in notes
    if page.endswith("stragglers.py"):
        at.number_input[0].set_value(13).run()  # a healthy step off the sample: its raw rows are gone
        notes = "\n".join(str(i.value) for i in at.info)
        assert "The raw records of step 13 were not kept (retention). Steps kept raw near it: 10" in notes
