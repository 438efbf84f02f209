"""From symptoms to causes, end to end: the example GPT under the bundled engine on 4 real gloo
ranks, rank 3 slowed down on purpose (trainer.examples.faults), streaming into a real collector
process; then `rankscope health --json` on every run and the Overview in headless Chromium.

- cost: rank 3 waits d ms before each forward, d in {0, 30, 80}; for d > 0 the top finding is a
  straggler naming rank 3 whose cost per step is within 25% of the measured rise in median step
  time over the d = 0 run (step times measured by the training script itself), widened by twice
  that measurement's own standard error. 4 ranks share 2 cores here, so the job's measured rise is
  not d: a rank that waits takes or frees CPU the others use (for d = 30 it ranged 17-37 ms over
  repeated runs; for d = 80, 76-105 ms, while the estimate read 73-83). On such a host the cost the
  late rank imposes lies between the injected delay and the measured rise, so the 25% bound is
  taken around that interval; with a core per rank the two agree and it is the plain 25% bound;
- no false alarms: the d = 0 run has no straggler or communication warning, no share over 100%;
- causes: cyclic garbage collected each step -> GC; a data loader that sleeps -> data loading;
  busy loops taking ~90% of the rank's core (trainer.examples.faults.HOG_NICE) -> host CPU;
- onset: a rank that turns slow at step 40 of 80 is reported slow from step 40 (+-2).

All runs are trained by one torchrun job, one after the other, so they share the start-up cost.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from collector.data.findings import stragglers
from collector.testing.dashboard import DashboardProcess, browser_tab
from collector.testing.ports import free_port
from collector.tools.launch import CollectorProcess
from tests.integration._browser import NEEDS_CHROMIUM, SCREENSHOTS
from tests.integration._health import health

pytestmark = pytest.mark.timing  # CPU sharing between ranks or wall-clock gaps: `make test-stress`

RANK, STEPS = 3, 32
# the healthy run second: the job's first run pays its start-up (allocator, first collectives, lazy imports)
RUNS = ["sleep:30", "sleep:0", "sleep:80", "gc:40", "data:40", "cpu:0", "sleep:40@40x80"]
CAUSES = {"gc40": ("gc", "GC pauses"), "data40": ("data", "data loading"), "cpu0": ("host_cpu", "host CPU")}
WARM_UP_STEPS = 2  # measured step times leave out the first steps (allocator, first collectives)


def run_name(spec: str) -> str:
    return "causes-" + spec.replace(":", "").replace("@", "from")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("causes-data")
    times_file = data_dir / "times.json"
    with CollectorProcess(data_dir) as collector:
        env = dict(os.environ, RANKSCOPE_ENDPOINT=collector.address, OMP_NUM_THREADS="1")
        train = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node",
                "4",
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                str(free_port()),
                "-m",
                "trainer.examples.faults",
                "--slow-rank",
                str(RANK),
                "--steps",
                str(STEPS),
                "--name",
                "causes",
                "--times",
                str(times_file),
                "--runs",
                *RUNS,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=540,
        )
        assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    return data_dir, json.loads(times_file.read_text())


def median_step_ms(times: list[float]) -> float:
    return 1e3 * statistics.median(times[WARM_UP_STEPS:])


def median_standard_error_ms(times: list[float]) -> float:
    """The standard error of a median step time: 1.253 sigma / sqrt(n), sigma from the IQR."""
    kept = times[WARM_UP_STEPS:]
    q1, _, q3 = statistics.quantiles(kept, n=4)
    return 1e3 * 1.253 * ((q3 - q1) / 1.349) / len(kept) ** 0.5


@pytest.mark.parametrize("d", [30, 80])
def test_the_straggler_cost_matches_the_measured_slowdown(runs, d):
    data_dir, times = runs
    (top, *_) = health(data_dir, run_name(f"sleep:{d}"))
    assert top["kind"] == "straggler" and top["ranks"] == [RANK], top
    slow, healthy = times[run_name(f"sleep:{d}")], times[run_name("sleep:0")]
    measured = median_step_ms(slow) - median_step_ms(healthy)
    noise = 2 * (median_standard_error_ms(slow) ** 2 + median_standard_error_ms(healthy) ** 2) ** 0.5
    low, high = min(measured, d), max(measured, d)  # the host's CPU sharing moves the rise off d
    cost = top["cost_ms_per_step"]
    assert 0.75 * low - noise <= cost <= 1.25 * high + noise, (top["text"], measured, noise)


def test_the_healthy_run_raises_no_straggler_or_communication_warning(runs):
    data_dir, times = runs
    found = health(data_dir, run_name("sleep:0"))
    warned = [f for f in found if f["severity"] in ("warning", "critical")]
    if warned:  # what the machine was doing, beside what was claimed: a busy host or a false claim
        healthy = times[run_name("sleep:0")]
        spread = median_standard_error_ms(healthy)
        load = f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores after the runs"
        machine = f"healthy run's median step {median_step_ms(healthy):.1f} ms (+-{spread:.1f} ms), {load}"
        raise AssertionError(f"warnings on the healthy run: {[f['text'] for f in warned]}; {machine}; {warned}")
    for f in found:
        for key in ("comm", "waiting", "transfer", "exposed", "overlapped", "share"):
            assert 0 <= f["evidence"].get(key, 0) <= 1, f


def measured_effect(times: dict, fault: str) -> tuple[bool, str]:
    """Whether the fault slowed the job by what the straggler finding names at all (its own bounds,
    MIN_COST_MS and MIN_COST_SHARE of the step, twice over, beyond the measurement's noise), and
    the figures. The delays (sleep, gc, data) always do; CPU contention is a fault only where the
    host lets it be one: beside enough other load the busy loops on rank 3's core take no more from
    it than the host already takes from every rank (and on a quiet 2-core host, 4 ranks, it
    slowed the whole job alike, issue #26)."""
    slow, healthy = times[f"causes-{fault}"], times[run_name("sleep:0")]
    rise = median_step_ms(slow) - median_step_ms(healthy)
    noise = 2 * (median_standard_error_ms(slow) ** 2 + median_standard_error_ms(healthy) ** 2) ** 0.5
    bound = 2 * max(stragglers.MIN_COST_MS, stragglers.MIN_COST_SHARE * median_step_ms(healthy)) + noise
    return rise >= bound, f"step time rose {rise:.1f} ms over the healthy run's (bound {bound:.1f} ms)"


@pytest.mark.parametrize("fault", list(CAUSES))
def test_the_cause_is_named(runs, fault):
    data_dir, times = runs
    cause, words = CAUSES[fault]
    found = health(data_dir, f"causes-{fault}")
    took_effect, figures = measured_effect(times, fault)
    if not took_effect:  # no fault to find: nothing may be claimed about another rank or another cause
        wrong = [
            f
            for f in found
            if f["kind"] == "straggler" and (f["ranks"] != [RANK] or f["evidence"].get("cause") not in (None, cause))
        ]
        assert not wrong, (figures, wrong)
        return
    (top, *_) = found
    assert top["kind"] == "straggler" and top["ranks"] == [RANK], (figures, top)
    assert top["evidence"].get("cause") == cause and words in top["text"], (figures, top["text"])


def test_the_onset_is_where_the_rank_turned_slow(runs):
    data_dir, times = runs
    # The job's own clock is the reference: the turn it shows for good, the first 5 steps in a row
    # each 20 ms (half the fault) over the median step before. The fault begins at step 40 (index 39
    # of the measured times: [i] is the time from step i + 1's end to step i + 2's). On a loaded host
    # the others' stalls can hide the late rank on a step, so the clock may show the turn a few steps
    # later; and a stall of every rank can lift a few steps around the injection that then fall back
    # (beside a CPU hog: +39, +47, +88, then +7.5 ms at steps 40-43; the reported onset was 44, where
    # the clock's rise then held). The reported onset must lie between the injected step and the turn
    # the clock shows for good, +-2 either side.
    measured = times[run_name("sleep:40@40x80")]
    before = statistics.median(measured[WARM_UP_STEPS:39])
    rise_ms = [round(1e3 * (t - before), 1) for t in measured]
    shown = next((i + 1 for i in range(39, 46) if min(rise_ms[i : i + 5]) >= 20), None)
    if shown is None:
        pytest.skip(f"the job's step times show no lasting turn at steps 40-46 on this host now: {rise_ms[39:51]}")
    (top, *_) = health(data_dir, run_name("sleep:40@40x80"))
    assert top["kind"] == "straggler" and top["ranks"] == [RANK], top
    onset = top["evidence"]["onset_step"]
    assert 40 - 2 <= onset <= shown + 2, (onset, shown, rise_ms[39:51], top["text"])
    assert "slow since step" in top["text"], top["text"]


@pytest.fixture(scope="module")
def tab(runs):
    data_dir, _ = runs
    with DashboardProcess(data_dir) as dashboard, browser_tab() as page:
        yield dashboard.url, page


@pytest.mark.parametrize("fault", list(CAUSES))
@NEEDS_CHROMIUM[0]
@NEEDS_CHROMIUM[1]
def test_the_overview_names_the_cause(runs, tab, fault):
    data_dir, times = runs
    url, page = tab
    _, words = CAUSES[fault]
    took_effect, figures = measured_effect(times, fault)
    if not took_effect:
        pytest.skip(f"the fault did not slow the job on this host now: {figures} (test_the_cause_is_named checks it)")
    run_id = next(f for f in os.listdir(data_dir / "parquet" / "comm") if f.startswith(f"run=causes-{fault}-"))[4:]
    page.goto(f"{url}/overview?run={run_id}")
    try:
        page.get_by_text(f"rank {RANK} costs", exact=False).first.wait_for(timeout=90_000)
        assert page.get_by_text(words, exact=False).count() >= 1
    finally:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"causes-{fault}.png"), full_page=True)


@pytest.mark.slow
def test_the_demo_run_is_healthy(tmp_path):
    """What every new user sees first: `rankscope demo`'s run (4 ranks, ZeRO-2, overlap_comm, nobody
    slowed) must not report a straggler or a communication warning."""
    demo = subprocess.run(
        [
            sys.executable,
            "-m",
            "collector.tools.cli",
            "demo",
            "--no-dashboard",
            "--exit",
            "--steps",
            "40",
            "--port",
            str(free_port()),
            "--data-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    found = health(tmp_path, "demo")
    assert not [f for f in found if f["severity"] in ("warning", "critical")], found
    assert any(f["kind"] == "exposed_communication" and f["evidence"]["comm"] <= 1 for f in found)
