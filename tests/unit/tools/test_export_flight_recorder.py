"""`rankscope export --flight-recorder RUN DIR`: per-rank dumps that torch's own analyzer
(`python -m torch.distributed.flight_recorder.fr_trace`) reads, with the verdict on a hang that
`rankscope health` gives (the sequence number and the missing ranks), and nothing to say about a
healthy run. Runs from sample_runs/ (a real 4-rank engine hang and a healthy run); the gloo hang
of tests/integration/tools/test_import_flight_recorder.py goes through the same round trip.

Split by tier: what needs processes, sockets or seconds is in tests/integration/tools/test_export_flight_recorder.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._import_util import rankscope

SAMPLE_RUNS = Path(__file__).resolve().parents[3] / "sample_runs"

pytestmark = pytest.mark.skipif(
    not (SAMPLE_RUNS / "catalog.duckdb").exists(), reason="sample_runs/ not generated (make sample-runs)"
)


def test_an_unknown_run_is_named(tmp_path, capsys):
    assert rankscope("export", "--flight-recorder", "no-such-run", tmp_path / "fr", "--data-dir", SAMPLE_RUNS) == 1
    assert "no-such-run" in capsys.readouterr().err
