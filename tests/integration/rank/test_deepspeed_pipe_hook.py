"""Real DeepSpeed 0.19.8 pipelines under ``python -m collector.hook`` (the benchmarks' DeepSpeed venv): a
PipelineEngine on 2 CPU ranks under torchrun writes ``pipe`` rows from its instruction schedule, so the
bubbles, the slow-stage finding and the Pipeline page work as for the bundled engine. The script
(``_deepspeed_pipe_script.py``) has nothing of rankscope in it; its stage 1 is slower by a sleep.

Skips, saying why, where the venv cannot be made (no network to install DeepSpeed)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from collector.data import findings, queries
from collector.data.pipeline import stage_bubbles, timeline
from collector.testing.collectors import live_collector
from collector.testing.ports import free_port

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "_deepspeed_pipe_script.py"
WORLD, STEPS, MICRO_BATCHES = 2, 8, 4

# slow: 98 s at load ~30 on 2 cores; timing: stage times are sleeps. The first run
# on a machine creates the DeepSpeed venv (pip, minutes).
pytestmark = [pytest.mark.timeout(2400), pytest.mark.slow, pytest.mark.timing]


@pytest.fixture(scope="module")
def ds_pipe(tmp_path_factory):
    from benches import _deepspeed_venv as venv

    try:
        env = venv.ensure_rank_side()
    except (subprocess.SubprocessError, OSError, RuntimeError) as exc:
        pytest.skip(f"no DeepSpeed venv ({venv.VENV}) and it cannot be made here: {exc}")
    out = tmp_path_factory.mktemp("ds_pipe")
    with live_collector(out / "data") as (endpoint, data_dir):
        env["RANKSCOPE_ENDPOINT"] = endpoint
        torchrun = [
            str(venv.VENV / "bin" / "torchrun"),
            "--nproc-per-node",
            str(WORLD),
            "--master-port",
            str(free_port()),
        ]
        done = subprocess.run(
            [*torchrun, "-m", "collector.hook", "--run-name", "ds-pipe", str(SCRIPT), str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    cat = queries.Catalog(data_dir)
    (run_id,) = cat.df("SELECT run_id FROM runs WHERE name = ?", ["ds-pipe"]).run_id
    return cat, run_id, ranks


def test_every_instruction_of_every_step_is_a_pipe_row(ds_pipe):
    cat, run_id, ranks = ds_pipe
    assert [r["stage"] for r in ranks] == [0, 1]
    rows = cat.df("SELECT rank, stage, step, kind, micro_batch FROM pipe WHERE run_id = ? ORDER BY start_ns", [run_id])
    assert not rows.empty, "DeepSpeed's PipelineEngine under the hook wrote no pipe rows"
    assert rows.step.nunique() == STEPS, sorted(rows.step.unique())
    for (rank, step), got in rows.groupby(["rank", "step"]):
        for kind in ("fwd", "bwd"):
            assert sorted(got[got.kind == kind].micro_batch) == list(range(MICRO_BATCHES)), (rank, step, got)
        waits = "recv_act" if rank == 1 else "recv_grad"
        assert sorted(got[got.kind == waits].micro_batch) == list(range(MICRO_BATCHES)), (rank, step, got)
        assert (got.kind == "reduce").any(), (rank, step, got)
    line = timeline(cat, run_id, step=int(rows.step.max()))
    last = line[(line.stage == 1) & line.kind.isin(["fwd", "bwd"])]
    assert list(zip(last.kind, last.micro_batch))[:4] == [("fwd", 0), ("bwd", 0), ("fwd", 1), ("bwd", 1)]


def test_the_slow_stage_is_named_and_no_rank_is_a_straggler(ds_pipe):
    cat, run_id, _ = ds_pipe
    bubbles = stage_bubbles(cat, run_id)
    assert set(bubbles.stage) == {0, 1} and (bubbles.bubble_fraction.dropna() >= 0).all(), bubbles
    found = findings.for_run(cat, run_id)
    shown = [(f.kind, f.ranks, f.text) for f in found]
    (slow,) = [f for f in found if f.kind == "stage_imbalance"]
    assert slow.evidence["stage"] == 1 and slow.ranks == (1,), shown
    assert not [f for f in found if f.kind == "straggler"], shown


def test_the_pipeline_page_draws_the_run(ds_pipe, monkeypatch):
    from tests.integration.app._pages import open_page

    cat, run_id, _ = ds_pipe
    at = open_page(cat.data_dir, monkeypatch, "views/pipeline.py", [run_id])
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert len(at.get("plotly_chart")) == 2, "the Pipeline page: the step timeline and bubbles per stage"
