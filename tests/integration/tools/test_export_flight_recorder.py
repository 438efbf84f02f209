"""`rankscope export --flight-recorder RUN DIR`: per-rank dumps that torch's own analyzer
(`python -m torch.distributed.flight_recorder.fr_trace`) reads, with the verdict on a hang that
`rankscope health` gives (the sequence number and the missing ranks), and nothing to say about a
healthy run. Runs from sample_runs/ (a real 4-rank engine hang and a healthy run); the gloo hang
of tests/integration/tools/test_import_flight_recorder.py goes through the same round trip.

Split by tier: the pure-function tests are in tests/unit/tools/test_export_flight_recorder.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from collector.data import catalog
from tests._import_util import rankscope
from tests.unit.tools.test_export_flight_recorder import SAMPLE_RUNS

pytestmark = pytest.mark.skipif(
    not (SAMPLE_RUNS / "catalog.duckdb").exists(), reason="sample_runs/ not generated (make sample-runs)"
)


def analyzer_verdicts(dumps: Path) -> list[tuple[int, list[int]]]:
    """(sequence number, missing ranks) of each 'Not all ranks joining collective' torch's analyzer reports."""
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(dumps), "-p", "rank_"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    said = done.stdout + done.stderr  # it reports through a logger: stderr
    seqs = re.findall(r"Not all ranks joining collective, sequence number: (\d+)", said)
    missing = re.findall(r"missing ranks: \{([\d, ]*)\}", said)
    return [(int(s), sorted(int(r) for r in m.split(",") if r.strip())) for s, m in zip(seqs, missing, strict=True)]


def hang_verdicts(data_dir, run: str) -> list[tuple[int, list[int]]]:
    con = catalog.connect(data_dir)
    try:
        rows = con.execute(
            "SELECT h.seq, h.missing_ranks FROM hangs h JOIN runs r USING (run_id) WHERE r.name = ? OR r.run_id = ?",
            [run, run],
        ).fetchall()
    finally:
        con.close()
    return [(int(seq), sorted(missing)) for seq, missing in rows]


def test_the_analyzer_finds_the_hang_rankscope_finds(tmp_path):
    want = hang_verdicts(SAMPLE_RUNS, "zero2-hang-rank2")
    assert want and want[0][1] == [2]
    assert rankscope("export", "--flight-recorder", "zero2-hang-rank2", tmp_path / "fr", "--data-dir", SAMPLE_RUNS) == 0
    assert sorted(p.name for p in (tmp_path / "fr").iterdir()) == [f"rank_{r}" for r in range(4)]
    assert analyzer_verdicts(tmp_path / "fr") == want


def test_the_analyzer_has_nothing_to_say_about_a_healthy_run(tmp_path):
    assert hang_verdicts(SAMPLE_RUNS, "zero2-slow-rank3") == []
    assert rankscope("export", "--flight-recorder", "zero2-slow-rank3", tmp_path / "fr", "--data-dir", SAMPLE_RUNS) == 0
    assert analyzer_verdicts(tmp_path / "fr") == []
