"""Retention splits a segment that straddles the rolled-up window into the kept raw rows and
the rows past the window, in one ledger record. SIGKILL the collector's retention pass after
the outputs are written but before that record, and after the record while its renames are
half done: on restart the data dir holds the old segments or the new ones, never both (rows
counted twice) nor neither (rows lost)."""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from collector.data import catalog, layout
from collector.data.codec import envelope_rows
from collector.server.ledger import Ledger
from collector.server.store import Store
from collector.tools import simulate
from collector.tools.importers.sink import envelope

ROOT = Path(__file__).resolve().parents[3]
SIM = simulate.Simulation(ranks=8, steps=20, stragglers=(simulate.Straggler(2, 20_000_000, 7),), run_id="kill")
PER_STEP = SIM.ranks * SIM.per_step


def _prepare(d: Path) -> None:
    """Steps 0-12 in one flush (it straddles the window 0-11 that retention will settle), 13-19 in another."""
    catalog.ensure_catalog(d)
    store = Store(d)
    comm = SIM.block(0, SIM.ranks)["comm"]
    step = comm.column("step").to_numpy()
    hello = [r for rank in range(SIM.ranks) for r in envelope_rows(envelope("h", 1, hello=SIM.hello(rank)))]
    for seq, rows in enumerate([hello, comm.filter(step <= 12), comm.filter(step > 12)], start=1):
        store.submit("test", seq, rows if seq == 1 else [("comm", SIM.run_id, rows)], lambda e: None)
        store.flush()
    store.close()


def _rows_per_step(d: Path) -> dict[int, int]:
    files = sorted(layout.partition_dir(d, "comm", SIM.run_id).glob(f"*{layout.SEGMENT_SUFFIX}"))
    return dict(sorted(collections.Counter(s for f in files for s in pq.read_table(f)["step"].to_pylist()).items()))


def _kill_at(d: Path, point: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.server._retention_kill_worker", str(d), SIM.run_id, point],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line == "ready", f"the worker did not reach {point}: {line!r}"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("point", ["outputs-written", "mid-apply"])
def test_a_kill_leaves_the_old_segments_or_the_split_ones_never_both_or_neither(tmp_path, point):
    d = tmp_path / "data"
    _prepare(d)
    before = _rows_per_step(d)
    assert before == {s: PER_STEP for s in range(20)}
    _kill_at(d, point)
    Ledger(d).close()  # a restarted collector recovers the data dir first
    assert not list((d / layout.PARQUET_DIR).rglob(f"*{layout.TEMP_SUFFIX}"))
    after = _rows_per_step(d)
    if point == "outputs-written":  # the record never made it: the old segments, every row once
        assert after == before
        return
    # committed: the window 0-11 keeps every 5th step and the straggler's steps, step 12 (past the
    # window, in the straddling flush) and the later flush are untouched
    kept = {0, 5, 10, 7, 8, 9, 11}
    assert after == {s: PER_STEP for s in sorted(kept | set(range(12, 20)))}
