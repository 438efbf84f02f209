"""The fault-injection suite: how well `rankscope health` diagnoses, scored the way papers score it.

    python -m benches.faults [--only NAME,...] [--quick] [--repeat N] [--auto-profile] [--out benches/RESULTS-faults.md]

Target (issue 27): F1 >= 0.97 overall and >= 0.9 per class; no warning on any healthy case;
stragglers named with the right onset; cost within +-25% of the measured step-time rise; hangs,
desyncs and crashes named within hang_after_s + 1 s of onset (p90). Issue 45: a hang at default
settings named stuck <= 5 s after onset (p90), no stuck warning on any healthy case.

Method. Each case is a real run with one fault injected on purpose (or none: the healthy shapes
users write), then `rankscope health RUN --json` as a user runs it:
- ``ddp``: collector/testing/workloads/ddp_train.py, plain DDP as people write it (AdamW, no_sync
  accumulation, a logging all_reduce), on 2 gloo ranks under ``torchrun -m collector.hook``,
  streaming into one real collector process;
- ``engine``: the bundled engine's example GPT with ZeRO-2 on 4 ranks (trainer.examples.faults);
- ``hf``/``lightning``: the Hugging Face Trainer and Lightning scripts of tests/integration/rank, healthy and
  with rank 1 50 ms late each step (collector/testing/workloads/framework_faults.py);
- ``simulate``: `rankscope simulate` at 1,024 and 8,192 ranks (and a slow host link at 1,024, with
  host groups and over the world group only);
- ``hosts``: collector/testing/workloads/hosts_train.py over 2 or 3 "hosts" (network namespaces,
  collector.testing.multihost; skipped where namespaces cannot be made), one host's link throttled
  with tc tbf from a loop index (and restored at another), or a compute straggler; cases whose
  args start with ``world`` run collector/testing/workloads/world_train.py instead: plain DDP or
  FSDP2 over the world group only (1 or 4 ranks a host, 2 to 4 hosts), as most jobs are written,
  and real DeepSpeed ZeRO-2 under the hook (its venv, benches/_deepspeed_venv.py; ``--auto-probe``:
  the collector probes the links a finding leaves in doubt); ``pipe`` ones run
  collector/testing/workloads/pipe_train.py: the bundled engine's pipeline, 2 stages across hosts,
  each stage's data-parallel replicas across hosts (1 rank a host) or inside and across (2 a host),
  and the same script on DeepSpeed's own PipelineEngine (``dspipe``).
  Multi-host runs are also scored apart: slow-link and straggler F1 over them alone, where the
  slow link was put (its host named alone and right / an honest "or" that holds it / wrong) and
  its detection delay in steps;
- ``sample``: the archived sample runs (sample_runs/).
Live faults (hang, crash, desync) are polled from the fault's own timestamp (the rank writes it
when it injects) until the expected finding appears; the delay is the time to detect. The poll
runs what `rankscope health` runs (ask the live collector for the run; where it does not hold it,
open the catalog, resolve the run, judge it) in this process,
so a poll's cost is the reading and judging, not a new interpreter's imports (1-4 s on a loaded
2-core host, which would otherwise count as detection delay). The job is then stopped. Where the
time went is measured hop by hop (``Hops``: onset -> the waiting rank entered -> its watchdog
reported -> the row readable in D -> health named it; for a crash, onset -> the stream closed ->
readable -> named) and tabled per class; ``--repeat N`` runs each live case N times for the p90.
Stuck (issue 45) is the live collector's judgment alone, on what is in flight: every ddp and
framework case is watched while it runs through the Health RPC `rankscope health` asks first
(LiveWatch, every 0.25 s), and the stuck findings said then join the ones read after it; a hang
at default settings (no hang_after_s) is scored on being named stuck, timed from its onset to
the first stuck warning the watch saw, and a healthy case must never get one.

Scoring. A case states what must be found: (class, ranks), with an onset for stragglers that turn
slow. Every warning or critical finding is a prediction; it is a true positive when its class and
ranks match an expected one (each expected finding counted once), else a false positive; an
expected finding with no match is a false negative. Per class and overall: precision, recall, F1.
Straggler cost error: |cost - measured rise| / rise, the rise being the case's mean step time
(measured by the script, the first 2 steps left out) minus the healthy case's median: the cost is
a mean per step (an intermittent straggler moves the median step not at all), and the healthy
run's typical step is its median (a mean of 30 tiny steps moves with one scheduler hiccup). The
table goes to benches/RESULTS-faults.md and README's "How well it diagnoses".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import duckdb

from collector.data import findings, queries

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = REPO / "collector" / "testing" / "workloads" / "ddp_train.py"
HANG_AFTER_S = 5.0
POLL_TIMEOUT_S = 60.0

# a finding kind -> the class it scores in
CLASSES = {
    "straggler": "straggler",
    "hang": "hang",
    "desync": "desync",
    "rank_stopped": "crash",
    "silent_rank": "silent",
    "loss_scale": "loss_scale",
    "moe_imbalance": "moe_imbalance",
    "loss_anomaly": "loss",
    "memory_growth": "memory",
    "slow_link": "slow_link",
    "stuck": "stuck",
}
LIVE_ONLY = ("stuck",)  # judged by the live collector alone, on what is in flight: never in the stored findings


@dataclass(frozen=True)
class Expect:
    cls: str
    ranks: tuple[int, ...] | None = None  # None: any ranks
    onset: int | None = None  # stragglers that turn slow: the step they do
    window: tuple[int, int] | None = None  # transient ones: the steps they were slow in
    optional: bool = False  # a side effect that may or may not show (a leak's allocations slow its rank)


@dataclass
class Case:
    name: str
    source: str  # ddp, engine, hf, lightning, simulate, hosts, sample
    args: tuple[str, ...] = ()
    expect: tuple[Expect, ...] = ()
    live: str | None = None  # poll for this class while the job runs (hang, crash, desync)
    ranks: int = 2
    quick: bool = False  # part of the subset `make test` runs (tests/integration/test_fault_suite.py)
    hang_after_s: float | None = HANG_AFTER_S  # the ranks' setting; None: the default (60 s), stuck adaptive
    note: str | None = None  # an info finding must say this (a healthy pause the stacks explain)


@dataclass
class Outcome:
    case: Case
    found: list[dict] = field(default_factory=list)
    tp: list[tuple[Expect, dict]] = field(default_factory=list)
    fp: list[dict] = field(default_factory=list)
    fn: list[Expect] = field(default_factory=list)
    detect_s: float | None = None
    cost_error: float | None = None
    onset_error: int | None = None
    median_step_ms: float | None = None  # step times the script measured (the first 2 left out)
    link_rise_ms: float | None = None  # hosts: the median step's rise while the link was throttled
    localised: str | None = None  # hosts, throttled: the link's host named "alone", among an "or", or "wrong"
    by_probe: bool = False  # hosts: a link probe (collect --auto-probe) is what placed it
    delay_steps: int | None = None  # hosts, throttled: the slow link's detection step less its onset
    mean_step_ms: float | None = None
    seconds: float = 0.0
    health_s: float | None = None  # `rankscope health` on the finished run (a fresh process)
    hops: dict[str, float] = field(default_factory=dict)  # live faults: where the time to detect went
    note_missing: bool = False  # the case's note was not said


S = "straggler"
# each source's healthy case: the step time a straggler's cost is measured against
BASELINES = ("ddp-healthy", "engine-healthy", "hf-trainer-healthy", "lightning-healthy")


def cases() -> list[Case]:
    slow = (Expect(S, (1,)),)
    ddp = [
        Case("ddp-healthy", "ddp"),
        Case("ddp-eval-pass", "ddp", ("--eval-every", "5")),
        Case("ddp-jitter", "ddp", ("--jitter-ms", "4")),
        Case("ddp-checkpoint", "ddp", ("--save-every", "10")),
        # a 20 s save on rank 0 at default settings while rank 1 waits at the barrier: an info naming it
        Case(
            "ddp-checkpoint-20s",
            "ddp",
            ("--steps", "30", "--save-every", "20", "--save-ms", "20000"),
            hang_after_s=None,
            note="rank 0 is saving a checkpoint",
        ),
        Case("ddp-slow-first-step", "ddp", ("--first-step-ms", "400")),
        Case("ddp-accumulation-4", "ddp", ("--accum", "4")),
        # rank 1's loader stalls 1 s every 10 steps at default settings: the others wait, never stuck
        Case("ddp-data-stalls-1s", "ddp", ("--fault", "data:1:1000@5/10"), hang_after_s=None),
        Case("ddp-straggler-50ms", "ddp", ("--fault", "sleep:1:50"), slow, quick=True),
        Case("ddp-straggler-20ms", "ddp", ("--fault", "sleep:1:20"), slow),
        Case("ddp-straggler-rank0", "ddp", ("--fault", "sleep:0:40"), (Expect(S, (0,)),)),
        # hook steps count from 1 (the optimizer's): the script's loop index i is step i + 1
        Case("ddp-late-onset", "ddp", ("--steps", "40", "--fault", "sleep:1:50@20"), (Expect(S, (1,), onset=21),)),
        Case("ddp-intermittent", "ddp", ("--steps", "40", "--fault", "sleep:1:80/4"), slow),
        Case(
            "ddp-transient",
            "ddp",
            ("--steps", "40", "--fault", "sleep:1:60@10-19"),
            (Expect(S, (1,), window=(11, 20)),),
        ),
        Case("ddp-data-loader", "ddp", ("--fault", "data:1:25"), slow),
        Case("ddp-gc-pauses", "ddp", ("--fault", "gc:1:40"), slow),
        # hang_after_s 5 s: stuck at the 3 s floor (if judged before the hang), the critical hang at 5 s
        Case(
            "ddp-hang",
            "ddp",
            ("--steps", "60", "--fault", "hang:1@25"),
            (Expect("hang"), Expect("stuck", (1,), optional=True)),
            live="hang",
            quick=True,
        ),
        # default settings (hang_after_s 60 s): the live collector names it stuck in seconds (issue 45)
        Case(
            "ddp-hang-default",
            "ddp",
            ("--steps", "60", "--fault", "hang:1@25"),
            (Expect("stuck", (1,)),),
            live="stuck",
            quick=True,
            hang_after_s=None,
        ),
        Case("ddp-crash", "ddp", ("--steps", "60", "--fault", "exit:1@25"), (Expect("crash"),), live="crash"),
        Case(
            "ddp-desync",
            "ddp",
            ("--steps", "60", "--fault", "desync:1@25"),
            (Expect("desync"),),
            live="desync",
            quick=True,
        ),
        Case("ddp-nan-loss", "ddp", ("--fault", "nan:0@15"), (Expect("loss"),), quick=True),
        Case("ddp-loss-spike", "ddp", ("--fault", "spike:0:20@15-15"), (Expect("loss"),)),
        Case(
            "ddp-memory-growth",
            "ddp",
            ("--steps", "200", "--fault", "leak:1:3"),
            (Expect("memory", (1,)), Expect(S, (1,), optional=True)),
        ),
        Case("ddp-4-ranks-healthy", "ddp", (), ranks=4),
        Case("ddp-4-ranks-straggler", "ddp", ("--fault", "sleep:2:50"), (Expect(S, (2,)),), ranks=4),
    ]
    engine = [
        Case("engine-healthy", "engine", ("sleep:0",), ranks=4),
        Case("engine-straggler-40ms", "engine", ("sleep:40",), (Expect(S, (3,)),), ranks=4),
        Case("engine-late-onset", "engine", ("sleep:40@20x40",), (Expect(S, (3,), onset=20),), ranks=4),
        Case("engine-gc-pauses", "engine", ("gc:40",), (Expect(S, (3,)),), ranks=4),
        Case("engine-data-loader", "engine", ("data:40",), (Expect(S, (3,)),), ranks=4),
    ]
    steps = "RANKSCOPE_TEST_STEPS=30"
    frameworks = [
        Case("hf-trainer-healthy", "hf", (steps,)),
        Case("hf-trainer-straggler-50ms", "hf", (steps, "RANKSCOPE_TEST_FAULT=sleep:1:50"), slow, quick=True),
        Case("lightning-healthy", "lightning", (steps,)),
        Case("lightning-straggler-50ms", "lightning", (steps, "RANKSCOPE_TEST_FAULT=sleep:1:50"), slow),
    ]
    sim = []
    for n, hosts in ((1024, 128), (8192, 1024)):
        steps = "60" if n == 1024 else "30"
        base = ("--ranks", str(n), "--steps", steps, "--hosts", str(hosts))
        sim += [
            Case(f"sim{n}-healthy", "simulate", base, ranks=n),
            Case(f"sim{n}-straggler", "simulate", (*base, "--straggler", "517:40"), (Expect(S, (517,)),), ranks=n),
            # the simulated job froze when it was written: read later, its ranks are silent too
            Case(
                f"sim{n}-hang",
                "simulate",
                (*base, "--hang", "77:20"),
                (Expect("hang"), Expect("silent", optional=True)),
                ranks=n,
            ),
        ]
    sim += [
        Case(
            "sim1024-late-onset",
            "simulate",
            ("--ranks", "1024", "--steps", "60", "--hosts", "128", "--straggler", "300:40@30"),
            (Expect(S, (300,), onset=30),),
            ranks=1024,
        ),
        Case(
            "sim1024-two-stragglers",
            "simulate",
            ("--ranks", "1024", "--steps", "60", "--hosts", "128", "--straggler", "12:40", "--straggler", "900:40"),
            (Expect(S, (12, 900)),),
            ranks=1024,
        ),
    ]
    # the slow host's ranks (node-0017: ranks 136-143); with host groups, and over the world group
    # only (plain DDP over 128 hosts: the host named by its telemetry's arrival)
    link = "slow_link"
    sim1024 = ("--ranks", "1024", "--steps", "60", "--hosts", "128")
    slow_host = (Expect(link, tuple(range(136, 144)), onset=30),)
    late = (Expect(S, (300,), onset=30),)
    for name, extra, expect in (
        ("sim1024-slow-link", ("--slow-link", "17:4@30-50"), slow_host),
        ("sim1024-world-slow-link", ("--world-only", "--slow-link", "17:4@30"), slow_host),
        ("sim1024-world-healthy", ("--world-only",), ()),
        ("sim1024-world-straggler", ("--world-only", "--straggler", "300:40@30"), late),
        ("sim1024-host-groups-healthy", ("--host-groups",), ()),
        ("sim1024-host-groups-straggler", ("--host-groups", "--straggler", "300:40@30"), late),
    ):
        sim.append(Case(name, "simulate", (*sim1024, *extra), expect, ranks=1024))
    # hosts: (hosts, ranks a host, throttle HOST:RATE@FROM[-TO] in loop indexes or "-", workload args...);
    # hook steps count from 1: loop index i is step i + 1
    hosts = [
        # at 2 hosts either link explains it: named alone by its telemetry, or "or" (any ranks; where, scored apart)
        Case("hosts2x2-throttled", "hosts", ("2", "2", "1:50mbit@20-40"), (Expect(link, None, onset=21),), 4),
        Case("hosts3x2-throttled", "hosts", ("3", "2", "1:50mbit@20-40"), (Expect(link, (2, 3), onset=21),), 6),
        Case("hosts2x2-healthy", "hosts", ("2", "2", "-"), ranks=4),
        Case("hosts2x2-straggler", "hosts", ("2", "2", "-", "--fault", "sleep:3:60@15"), (Expect(S, (3,)),), 4),
    ]
    # the world group only (issue 43): any ranks for the slow link's F1 (an honest "or" names every
    # host's ranks), where it was put scored apart (Outcome.localised)
    world_link = Expect(link, None, onset=21)
    world = [
        ("ddp3x1-throttled-host1", "ddp", 3, 1, "1:80mbit@20", (world_link,)),
        ("ddp3x1-throttled-host0", "ddp", 3, 1, "0:80mbit@20-45", (world_link,)),
        ("ddp3x1-throttled-host2", "ddp", 3, 1, "2:80mbit@20", (world_link,)),
        ("ddp2x1-throttled", "ddp", 2, 1, "1:80mbit@20", (world_link,)),
        ("ddp4x1-throttled", "ddp", 4, 1, "3:80mbit@20", (world_link,)),
        ("ddp2x4-throttled", "ddp", 2, 4, "1:80mbit@20", (world_link,)),
        ("ddp3x4-throttled", "ddp", 3, 4, "2:80mbit@20", (world_link,)),
        ("ddp4x4-throttled", "ddp", 4, 4, "2:80mbit@20", (world_link,)),
        ("fsdp2x2-throttled", "fsdp2", 2, 2, "0:120mbit@20", (world_link,)),
        ("fsdp3x1-throttled", "fsdp2", 3, 1, "1:120mbit@20", (world_link,)),
        # real DeepSpeed ZeRO-2 under the hook (its own venv: benches/_deepspeed_venv.py)
        ("zero2-2x2-throttled", "zero2", 2, 2, "0:120mbit@20", (world_link,)),
        ("zero2-3x1-throttled", "zero2", 3, 1, "1:120mbit@20", (world_link,)),
        # a link that flaps (slow 5 of every 15 loop indexes), two links slow at once
        ("ddp3x1-flapping-host1", "ddp", 3, 1, "1:80mbit@20-25,1:80mbit@35-40,1:80mbit@50", (world_link,)),
        ("ddp4x1-two-links", "ddp", 4, 1, "1:80mbit@20,2:80mbit@20", (world_link,)),
        ("ddp3x1-healthy", "ddp", 3, 1, "-", ()),
        ("ddp2x4-healthy", "ddp", 2, 4, "-", ()),
        ("fsdp2x2-healthy", "fsdp2", 2, 2, "-", ()),
        ("zero2-2x2-healthy", "zero2", 2, 2, "-", ()),
        ("ddp3x1-straggler", "ddp", 3, 1, "-", (Expect(S, (2,)),), "sleep:2:60@15"),
        ("ddp2x4-straggler", "ddp", 2, 4, "-", (Expect(S, (5,)),), "sleep:5:60@15"),
        ("fsdp2x2-straggler", "fsdp2", 2, 2, "-", (Expect(S, (1,)),), "sleep:1:60@15"),
    ]
    for name, mode, n_hosts, per_host, spec, expect, *fault in world:
        args = ("world", str(n_hosts), str(per_host), spec, "--mode", mode, *(("--fault", fault[0]) if fault else ()))
        hosts.append(Case(f"world-{name}", "hosts", args, expect, ranks=n_hosts * per_host))
    # pipeline parallelism over hosts (the bundled engine; 2 stages): stage groups and point-to-point
    # pairs; the engine counts steps from 0: loop index i is step i
    pipe_link = Expect(link, None, onset=20)
    pipes = [
        ("pipe4x1-throttled-host0", 4, 1, "0:80mbit@20", (pipe_link,)),
        ("pipe4x1-throttled-host2", 4, 1, "2:80mbit@20", (pipe_link,)),
        ("pipe4x2-throttled-host1", 4, 2, "1:80mbit@20", (pipe_link,)),
        ("pipe2x2-throttled", 2, 2, "0:80mbit@20", (pipe_link,)),
        ("pipe4x1-healthy", 4, 1, "-", ()),
        ("pipe4x2-healthy", 4, 2, "-", ()),
        ("pipe4x1-straggler", 4, 1, "-", (Expect(S, (1,)),), "sleep:1:60@15"),
    ]
    for name, n_hosts, per_host, spec, expect, *fault in pipes:
        args = ("pipe", str(n_hosts), str(per_host), spec, "--stages", "2", *(("--fault", fault[0]) if fault else ()))
        hosts.append(Case(name, "hosts", args, expect, ranks=n_hosts * per_host))
    # 3D parallelism: PP 2 x TP 2 x DP 2 on 4 hosts of 2 ranks, a TP pair a host (its all_reduces never leave it)
    for name, spec, expect in (
        ("pp2tp2dp2-throttled-host1", "1:80mbit@20", (pipe_link,)),
        ("pp2tp2dp2-healthy", "-", ()),
    ):
        hosts.append(Case(name, "hosts", ("pipe", "4", "2", spec, "--stages", "2", "--tp", "2"), expect, ranks=8))
    # DeepSpeed's own PipelineEngine, the same script under the hook (its venv; hook steps count from 1)
    for name, spec, expect in (
        ("dspipe4x1-throttled-host0", "0:80mbit@20", (world_link,)),
        ("dspipe4x1-healthy", "-", ()),
    ):
        args = ("pipe", "4", "1", spec, "--stages", "2", "--engine", "deepspeed")
        hosts.append(Case(name, "hosts", args, expect, ranks=4))
    sample = [
        Case("sample-zero2-slow-rank3", "sample", ("zero2-slow-rank3",), (Expect(S, (3,)),), ranks=4, quick=True),
        Case(
            "sample-zero2-hang-rank2",
            "sample",
            ("zero2-hang-rank2",),
            (Expect("hang"), Expect("crash")),
            ranks=4,
            quick=True,
        ),
        Case("sample-zero3-fp16-overflows", "sample", ("zero3-fp16-overflows",), (Expect("loss_scale"),), ranks=4),
        Case(
            "sample-moe-skewed-expert",
            "sample",
            ("moe-skewed-expert",),
            (Expect("moe_imbalance"), Expect("moe_imbalance")),
            ranks=4,
        ),
        Case("sample-simulated-256", "sample", ("simulated-256-ranks",), (Expect(S, (117,)),), ranks=256),
    ]
    return ddp + engine + frameworks + sim + hosts + sample


# ---- running a case ----


def health(data_dir: Path, run: str) -> list[dict]:
    out = subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", "health", run, "--data-dir", str(data_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode not in (0, 1, 2):
        raise RuntimeError(f"rankscope health {run}: exit {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def poll_health(data_dir: Path, run: str) -> list[dict]:
    """What `rankscope health RUN --json` prints, in this process (no interpreter start): the answer of
    the collector serving the data dir where it holds the run (its Health RPC), else computed from
    the data dir."""
    from collector.data.live_collector import fetch

    answer = fetch(data_dir, run)
    if answer is not None:
        return answer.findings
    cat = queries.Catalog(str(data_dir))
    try:
        return [f.to_json() for f in findings.for_run(cat, queries.resolve_run(cat.con, run))]
    finally:
        cat.close()


HOP_TABLES = {"hang": "inflight", "crash": "rank_events", "desync": "inflight"}  # the row that tells of the fault
WATCH_S = 0.25  # how often LiveWatch asks the live collector (its checker judges every 0.25 s)


class LiveWatch:
    """What the live collector says of a run while it runs (collector.data.live_collector.fetch, the
    Health RPC `rankscope health` asks first), every ``WATCH_S``: each finding of a LIVE_ONLY kind
    (stuck) as first seen, keyed by (kind, severity, ranks), with when. Those are judged on what is
    in flight and gone once it completes, so the stored findings read after the run never hold them:
    a case is scored on what it was said to be while it ran (a stuck warning on a healthy case is a
    false positive; an info, such as a checkpoint the others wait for, is a note)."""

    def __init__(self, data_dir: Path, run: str) -> None:
        self.data_dir, self.run = data_dir, run
        self.seen: dict[tuple, tuple[float, dict]] = {}  # (kind, severity, ranks) -> (first seen, finding)
        self.latest: list[dict] | None = None  # the last answer's findings (None: not held yet)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="live-watch", daemon=True)

    def start(self) -> LiveWatch:
        self._thread.start()
        return self

    def stop(self) -> list[dict]:
        """Stop watching; the live-only findings seen, in the order first seen."""
        self._stop.set()
        self._thread.join(10)
        return [f for _, f in sorted(self.seen.values(), key=lambda seen: seen[0])]

    def first(self, cls: str) -> float | None:
        """When a warning or critical finding of ``cls`` was first seen (wall clock), if it was."""
        times = [t for (kind, severity, _), (t, _) in list(self.seen.items())
                 if CLASSES.get(kind) == cls and severity in ("warning", "critical")]  # fmt: skip
        return min(times, default=None)

    def _watch(self) -> None:
        from collector.data.live_collector import fetch

        while not self._stop.wait(WATCH_S):
            answer = fetch(self.data_dir, self.run)
            if answer is None:
                continue
            now = time.time()
            self.latest = answer.findings
            for f in answer.findings:
                if f["kind"] in LIVE_ONLY:
                    self.seen.setdefault((f["kind"], f["severity"], tuple(f["ranks"])), (now, f))


def _with_live(found: list[dict], live: list[dict]) -> list[dict]:
    """The findings of a run, and the live-only ones said while it ran that they lack."""
    have = {(f["kind"], f["severity"], tuple(f["ranks"])) for f in found}
    return found + [f for f in live if (f["kind"], f["severity"], tuple(f["ranks"])) not in have]


class Hops:
    """Where a live fault's time to detect goes, watched from this process (wall clock, one machine):
    the fault's onset (the rank's own timestamp); for a hang, when the waiting rank entered the
    collective and when its watchdog reported the wait past ``hang_after_s`` (the ``inflight`` row's
    own times); for a crash, when the collector saw the stream close (the ``rank_events`` row); when
    that row became readable (listed in D's snapshot: the store's commit, checked every 20 ms by
    reading the new segments of the snapshot); and when the polled health named the fault. Each
    poll's duration is kept too: a finding committed during a poll is seen by the next one."""

    def __init__(self, data_dir: Path, run: str, cls: str, onset: float) -> None:
        self.data_dir, self.run, self.table = data_dir, run, HOP_TABLES[cls]
        self.cls, self.onset = cls, onset
        self.row: dict | None = None  # the first row that tells of the fault
        self.visible_at: float | None = None
        self.polls: list[float] = []
        self._seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hops", daemon=True)

    def start(self) -> Hops:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _watch(self) -> None:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        from collector.data import catalog, layout

        while self.row is None and not self._stop.wait(0.02):
            files = (catalog.snapshot_files(self.data_dir) or {}).get(self.table, [])
            for f in files:
                if f in self._seen:
                    continue
                self._seen.add(f)
                try:
                    rows = pq.read_table(self.data_dir / f)
                except OSError:
                    continue  # merged away meanwhile: its rows are in the merged file
                # the run's id is its name (RANKSCOPE_RUN), a dash and when it started
                if "run_id" in rows.column_names:  # a collector table: runs share its partition
                    rows = rows.filter(pc.starts_with(rows["run_id"], f"{self.run}-"))
                elif f"/{layout.PARTITION_PREFIX}{self.run}-" not in f"/{f}":  # a rank table's partition is its run's
                    continue
                rows = rows.to_pylist()
                rows = [r for r in rows if (r.get("time_ns") or r["time"].timestamp() * 1e9) >= self.onset * 1e9]
                if self.cls == "hang":
                    rows = [r for r in rows if r["state"] == "waiting" and r["hang_after_s"]
                            and r["time_ns"] - r["entered_ns"] >= r["hang_after_s"] * 1e9]  # fmt: skip
                if rows:
                    self.visible_at = time.time()
                    self.row = min(rows, key=lambda r: r.get("time_ns") or 0)
                    break

    def measured(self, onset: float, detected: float | None) -> dict[str, float]:
        out = {"poll_s": statistics.median(self.polls)} if self.polls else {}
        row = self.row
        if row is not None and self.cls in ("hang", "desync"):
            out["onset_to_entered"] = row["entered_ns"] / 1e9 - onset
            out["entered_to_reported"] = (row["time_ns"] - row["entered_ns"]) / 1e9
            out["reported_to_visible"] = self.visible_at - row["time_ns"] / 1e9
        elif row is not None:
            closed = row["time"].timestamp()
            out["onset_to_closed"] = closed - onset
            out["closed_to_visible"] = self.visible_at - closed
        if self.visible_at is not None and detected is not None:
            out["visible_to_named"] = detected - self.visible_at
        return out


def _checked(what: str, cmd: list[str], **kwargs) -> None:
    """Run a case's job to its end; a job that fails stops the suite, saying which and why."""
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{what}: exit {done.returncode}: {done.stderr[-3000:]}")


def _env(endpoint: str, run: str, hang_after_s: float | None = HANG_AFTER_S) -> dict:
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        RANKSCOPE_ENDPOINT=endpoint,
        RANKSCOPE_RUN=run,
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        CUDA_VISIBLE_DEVICES="",
    )
    env.pop("RANKSCOPE_HANG_AFTER_S", None)  # None: the ranks' default
    if hang_after_s is not None:
        env["RANKSCOPE_HANG_AFTER_S"] = str(hang_after_s)
    return env


def _torchrun(ranks: int) -> list[str]:
    from collector.testing.ports import free_port

    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(ranks),
        "--master-port",
        str(free_port()),
    ]


def run_ddp(case: Case, work: Path, endpoint: str, data_dir: Path) -> Outcome:
    out = work / case.name
    cmd = [*_torchrun(case.ranks), "-m", "collector.hook", str(WORKLOAD), str(out), *case.args]
    env = _env(endpoint, case.name, case.hang_after_s)
    outcome = Outcome(case)
    watch = LiveWatch(data_dir, case.name).start()
    if case.live is None:
        try:
            _checked(case.name, cmd, env=env, timeout=600)
        finally:
            live = watch.stop()
        _step_time(outcome, out)
        outcome.found = _with_live(health(data_dir, case.name), live)
        return outcome
    # live: start, wait for the fault's timestamp, poll until the expected class shows
    job = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 300
        onset = None
        while onset is None and time.monotonic() < deadline:
            marks = list(out.glob("onset*.json")) if out.exists() else []
            if marks:
                onset = min(json.loads(m.read_text())["time"] for m in marks)
            else:
                time.sleep(0.2)
        if onset is None:
            raise RuntimeError(f"{case.name}: the fault never fired")
        # stuck is the live collector's alone (the watch asks it); the rest as `rankscope health` computes it
        hops = Hops(data_dir, case.name, case.live, onset).start() if case.live in HOP_TABLES else None
        while time.time() - onset < POLL_TIMEOUT_S:
            if case.live in LIVE_ONLY:
                seen = watch.first(case.live)
                if seen is not None:
                    outcome.detect_s, outcome.found = seen - onset, list(watch.latest or [])
                    break
                time.sleep(WATCH_S)
                continue
            t0 = time.perf_counter()
            try:
                found = poll_health(data_dir, case.name)
            except (queries.DataDirError, queries.UnknownRun, duckdb.Error):
                found = []  # no catalog, or not this run, yet
            hops.polls.append(time.perf_counter() - t0)
            if any(CLASSES.get(f["kind"]) == case.live and f["severity"] in ("warning", "critical") for f in found):
                outcome.detect_s = time.time() - onset
                outcome.found = found  # what a user polling health saw then; stopping the job comes after
                break
            time.sleep(0.25)
        if hops is not None:
            hops.stop()
            outcome.hops = hops.measured(onset, None if outcome.detect_s is None else onset + outcome.detect_s)
    finally:
        live = watch.stop()  # before the job is stopped: what its stopping does is not the fault's
        try:
            os.killpg(job.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            job.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    if outcome.detect_s is None:
        outcome.found = health(data_dir, case.name)
    outcome.found = _with_live(outcome.found, live)
    return outcome


def run_engine(batch: list[Case], work: Path, endpoint: str, data_dir: Path) -> list[Outcome]:
    """The engine's cases in one torchrun job (start-up shared), run by trainer.examples.faults."""
    times = work / "engine-times.json"
    specs = [c.args[0] for c in batch]
    cmd = [*_torchrun(4), "-m", "trainer.examples.faults", "--slow-rank", "3", "--steps", "32"]
    cmd += ["--name", "engine", "--times", str(times), "--runs", *specs]
    _checked("engine cases", cmd, env=_env(endpoint, "engine"), timeout=1200)
    measured = json.loads(times.read_text())
    outcomes = []
    for case, spec in zip(batch, specs, strict=True):
        run = "engine-" + spec.replace(":", "").replace("@", "from")
        outcome = Outcome(case)
        outcome.median_step_ms = 1e3 * statistics.median(measured[run][2:])
        outcome.mean_step_ms = 1e3 * statistics.fmean(measured[run][2:])
        outcome.found = health(data_dir, run)
        outcomes.append(outcome)
    return outcomes


def run_framework(case: Case, work: Path, endpoint: str, data_dir: Path) -> Outcome:
    name = "_hf_trainer_script.py" if case.source == "hf" else "_lightning_script.py"
    script = REPO / "tests" / "integration" / "rank" / name
    out = work / case.name
    out.mkdir(parents=True, exist_ok=True)
    env = _env(endpoint, case.name, case.hang_after_s) | dict(a.split("=", 1) for a in case.args)  # fault, steps
    watch = LiveWatch(data_dir, case.name).start()
    try:
        _checked(case.name, [*_torchrun(2), str(script), str(out)], env=env, timeout=600)
    finally:
        live = watch.stop()
    run_id = json.loads((out / "rank0.json").read_text())["run_id"]
    outcome = Outcome(case)
    _step_time(outcome, out)
    outcome.found = _with_live(health(data_dir, run_id), live)
    return outcome


def run_simulated(case: Case, work: Path) -> Outcome:
    data_dir = work / case.name
    cmd = [sys.executable, "-m", "collector.tools.cli", "simulate", *case.args, "--name", case.name]
    _checked(case.name, [*cmd, "--data-dir", str(data_dir)], timeout=1200)
    outcome = Outcome(case)
    t0 = time.perf_counter()
    outcome.found = health(data_dir, case.name)
    outcome.health_s = time.perf_counter() - t0  # the health command's own time at this scale
    return outcome


def run_hosts(case: Case, work: Path, auto_probe: bool = False) -> Outcome:
    from collector.testing import multihost

    workload, given = multihost.WORKLOAD, case.args
    if given[0] == "world":  # the world group only; ~2 MiB of gradients, so an 80 Mbit/s link shows
        workload, given = multihost.WORLD_WORKLOAD, (*given[1:], "--width", "256", "--layers", "8")
    elif given[0] == "pipe":  # 4 MiB of gradients a stage, 128 KiB activations a micro-batch
        workload, given = multihost.PIPE_WORKLOAD, given[1:]
    n_hosts, per_host, spec, *args = given
    throttles = () if spec == "-" else multihost.Throttle.parse_all(spec)
    python, rank_env = sys.executable, None
    # DeepSpeed's ranks run in its venv, the hook and this repo on their path
    if "zero2" in args or "deepspeed" in args:
        from benches import _deepspeed_venv

        python, rank_env = str(_deepspeed_venv.PYTHON), _deepspeed_venv.ensure_rank_side()
    run = multihost.train_on_hosts(
        work / case.name, hosts=int(n_hosts), ranks_per_host=int(per_host), steps=55, name=case.name,
        throttle=throttles, workload_args=tuple(args), workload=workload, auto_probe=auto_probe,
        python=python, rank_env=rank_env,
    )  # fmt: skip
    outcome = Outcome(case)
    times = run.step_times[2:]
    outcome.median_step_ms = 1e3 * statistics.median(times)
    outcome.mean_step_ms = 1e3 * statistics.fmean(times)
    throttle = throttles[0] if throttles else None  # the first: its rise, onset and delay
    if throttle is not None:
        t, end = run.step_times, throttle.to_step or len(run.step_times)
        during = t[throttle.from_step + 2 : end]
        outcome.link_rise_ms = 1e3 * (statistics.median(during) - statistics.median(t[5 : throttle.from_step]))
    outcome.found = health(run.data_dir, case.name)
    links = [f for f in outcome.found if f["kind"] == "slow_link"]
    if throttle is not None and links:
        # every throttled host (two links slow at once: both, as one pair), or an "or" holding each
        right, named = sorted({f"host-{t.host}" for t in throttles}), links[0]["evidence"]["hosts"]
        held = right in named or all([h] in named for h in right)
        outcome.localised = "alone" if named == [right] else "or" if held else "wrong"
        outcome.by_probe = bool(links[0]["evidence"].get("probe"))
        bundled_pipe = workload == multihost.PIPE_WORKLOAD and "deepspeed" not in args
        first = 0 if bundled_pipe else 1  # the step of loop index 0: the engine counts from 0, the hook from 1
        outcome.delay_steps = int(links[0]["evidence"]["detected_step"]) - (throttle.from_step + first)
    return outcome


def multihost_table(outcomes: list[Outcome]) -> str:
    """Slow-link and straggler F1 over the multi-host runs alone, where the link was put, and how
    many steps after its onset it was found."""
    hosts = [o for o in outcomes if o.case.source == "hosts"]
    if not hosts:
        return ""
    lines = ["| class (multi-host runs) | cases | TP | FP | FN | F1 |", "|---|---:|---:|---:|---:|---:|"]
    for cls in ("slow_link", S):
        tp = sum(1 for o in hosts for e, _ in o.tp if e.cls == cls)
        fp = sum(1 for o in hosts for f in o.fp if CLASSES.get(f["kind"], f["kind"]) == cls)
        fn = sum(1 for o in hosts for e in o.fn if e.cls == cls)
        cases = sum(1 for o in hosts if any(e.cls == cls for e in o.case.expect))
        f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0
        lines.append(f"| {cls} | {cases} | {tp} | {fp} | {fn} | {f1:.2f} |")
    placed = [o.localised for o in hosts if o.localised is not None]
    delays = sorted(o.delay_steps for o in hosts if o.delay_steps is not None)
    lines.append("")
    lines.append(
        f"Where the slow link was put ({len(placed)} runs that found one): its host named alone "
        f'{placed.count("alone")} ({sum(o.by_probe for o in hosts)} of them by a link probe), an honest "or" that '
        f"holds it {placed.count('or')}, wrong {placed.count('wrong')}. "
        + (f"Detection delay: median {statistics.median(delays):g} steps, max {delays[-1]} steps." if delays else "")
    )
    return "\n".join(lines)


def _step_time(outcome: Outcome, out: Path) -> None:
    times = out / "times.json"
    if times.exists():
        measured = json.loads(times.read_text())[2:]
        outcome.median_step_ms = 1e3 * statistics.median(measured)
        outcome.mean_step_ms = 1e3 * statistics.fmean(measured)


# ---- scoring ----


def score(outcome: Outcome, healthy_ms: dict[str, float]) -> Outcome:
    predictions = [f for f in outcome.found if f["severity"] in ("warning", "critical")]
    unmatched = list(outcome.case.expect)
    for f in predictions:
        cls = CLASSES.get(f["kind"], f["kind"])
        match = next(
            (
                e
                for e in unmatched
                if e.cls == cls and (e.ranks is None or tuple(sorted(f["ranks"])) == tuple(sorted(e.ranks)))
            ),
            None,
        )
        if match is None:
            outcome.fp.append(f)
            continue
        unmatched.remove(match)
        outcome.tp.append((match, f))
        if match.onset is not None:
            onset = f["evidence"].get("onset_step")
            outcome.onset_error = None if onset is None else int(onset) - match.onset
        if cls == "slow_link" and outcome.link_rise_ms and outcome.link_rise_ms > 0 and f.get("cost_ms_per_step"):
            outcome.cost_error = abs(f["cost_ms_per_step"] - outcome.link_rise_ms) / outcome.link_rise_ms
        base = healthy_ms.get(outcome.case.source)
        if cls == S and base and outcome.mean_step_ms and match.onset is None and match.window is None:
            # what the job lost per step: the case's mean step against the healthy run's typical one
            rise = outcome.mean_step_ms - base
            if rise > 0 and f.get("cost_ms_per_step"):
                outcome.cost_error = abs(f["cost_ms_per_step"] - rise) / rise
    outcome.fn = [e for e in unmatched if not e.optional]
    note = outcome.case.note
    outcome.note_missing = note is not None and not any(
        f["severity"] == "info" and note in f["text"] for f in outcome.found
    )
    return outcome


def table(outcomes: list[Outcome]) -> tuple[str, dict]:
    per: dict[str, dict] = {}
    for o in outcomes:
        for e, _ in o.tp:
            per.setdefault(e.cls, dict(tp=0, fp=0, fn=0, cases=set(), detect=[]))["tp"] += 1
        for f in o.fp:
            per.setdefault(CLASSES.get(f["kind"], f["kind"]), dict(tp=0, fp=0, fn=0, cases=set(), detect=[]))["fp"] += 1
        for e in o.fn:
            per.setdefault(e.cls, dict(tp=0, fp=0, fn=0, cases=set(), detect=[]))["fn"] += 1
        for e in o.case.expect:
            per.setdefault(e.cls, dict(tp=0, fp=0, fn=0, cases=set(), detect=[]))["cases"].add(o.case.name)
            if o.detect_s is not None and e.cls == o.case.live:
                per[e.cls]["detect"].append(o.detect_s)

    def prf(tp, fp, fn):
        p = tp / (tp + fp) if tp + fp else 1.0
        r = tp / (tp + fn) if tp + fn else 1.0
        return p, r, (2 * p * r / (p + r) if p + r else 0.0)

    lines = [
        "| class | cases | TP | FP | FN | precision | recall | F1 | time to detect (p50 / p90) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    total = dict(tp=0, fp=0, fn=0)
    for cls in sorted(per):
        row = per[cls]
        p, r, f1 = prf(row["tp"], row["fp"], row["fn"])
        for k in total:
            total[k] += row[k]
        d = sorted(row["detect"])
        det = f"{statistics.median(d):.1f} s / {d[min(len(d) - 1, int(0.9 * len(d)))]:.1f} s" if d else "-"
        lines.append(
            f"| {cls} | {len(row['cases'])} | {row['tp']} | {row['fp']} | {row['fn']} "
            f"| {p:.2f} | {r:.2f} | {f1:.2f} | {det} |"
        )
    p, r, f1 = prf(total["tp"], total["fp"], total["fn"])
    healthy = [o for o in outcomes if not o.case.expect]
    lines.append(
        f"| **all** | {len(outcomes)} | {total['tp']} | {total['fp']} | {total['fn']} "
        f"| {p:.2f} | {r:.2f} | **{f1:.2f}** | |"
    )
    summary = {
        "f1": f1,
        "precision": p,
        "recall": r,
        "cases": len(outcomes),
        "healthy_warned": sum(1 for o in healthy if o.fp),
        "notes_missing": sum(o.note_missing for o in outcomes),
    }
    return "\n".join(lines), summary


def run_suite(
    selected: list[Case], work: Path, log=print, auto_profile: bool = False, auto_probe: bool = False
) -> list[Outcome]:
    """``auto_profile``: the live cases' collector profiles the suspects of its findings (collect's default);
    ``auto_probe``: the multi-host runs' collector probes the links a slow-link finding leaves in doubt."""
    from collector.tools.launch import CollectorProcess

    outcomes: list[Outcome] = []
    data_dir = work / "data"
    live = [c for c in selected if c.source in ("ddp", "engine", "hf", "lightning")]
    if live:
        with CollectorProcess(data_dir, auto_profile=auto_profile) as collector:
            for case in [c for c in live if c.source == "ddp"] + [c for c in live if c.source in ("hf", "lightning")]:
                t0 = time.perf_counter()
                o = (
                    run_ddp(case, work, collector.address, data_dir)
                    if case.source == "ddp"
                    else run_framework(case, work, collector.address, data_dir)
                )
                o.seconds = time.perf_counter() - t0
                outcomes.append(o)
                log(f"  {case.name}: {len(o.found)} findings in {o.seconds:.0f} s")
            batch = [c for c in live if c.source == "engine"]
            if batch:
                t0 = time.perf_counter()
                for o in run_engine(batch, work, collector.address, data_dir):
                    o.seconds = (time.perf_counter() - t0) / len(batch)
                    outcomes.append(o)
                    log(f"  {o.case.name}: {len(o.found)} findings")
    for case in selected:
        if case.source == "simulate":
            o = run_simulated(case, work)
            outcomes.append(o)
            log(f"  {case.name}: {len(o.found)} findings, health {o.health_s:.1f} s")
        elif case.source == "hosts":
            from collector.testing import netns

            why = netns.unavailable()
            if why is not None:
                log(f"  {case.name}: skipped, network namespaces: {why}")
                continue
            t0 = time.perf_counter()
            o = run_hosts(case, work, auto_probe)
            o.seconds = time.perf_counter() - t0
            outcomes.append(o)
            log(f"  {case.name}: {len(o.found)} findings in {o.seconds:.0f} s")
        elif case.source == "sample":
            o = Outcome(case, found=health(REPO / "sample_runs", case.args[0]))
            outcomes.append(o)
    healthy_ms = {}
    for o in outcomes:
        if not o.case.expect and o.median_step_ms and o.case.name in BASELINES:
            healthy_ms[o.case.source] = o.median_step_ms
    return [score(o, healthy_ms) for o in outcomes]


def _ranks(ranks) -> str:
    from collector.data.schema import rank_ranges

    return f" [{rank_ranges(list(ranks))}]" if ranks else ""


def report(outcomes: list[Outcome], wall_s: float, command: str = "python -m benches.faults") -> str:
    from benches._common import code_version
    from benches.dashboard_queries import machine

    text, summary = table(outcomes)
    rows = [
        "| case | expected | found (warning/critical) | verdict | detect | cost err | onset err | health s |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    for o in outcomes:
        exp = ", ".join(f"{e.cls}{_ranks(e.ranks)}{'?' if e.optional else ''}" for e in o.case.expect) or "nothing"
        got = (
            "; ".join(f"{f['kind']}{_ranks(f['ranks'])}" for f in o.found if f["severity"] in ("warning", "critical"))
            or "nothing"
        )
        verdict = "ok" if not o.fp and not o.fn else f"{len(o.fp)} FP, {len(o.fn)} FN"
        if o.case.note is not None:
            verdict += f" (note {'missing' if o.note_missing else 'said'}: {o.case.note!r})"
        if o.localised is not None:
            verdict += f" (link's host: {o.localised}, +{o.delay_steps} steps)"
        det = f"{o.detect_s:.1f} s" if o.detect_s is not None else ""
        cost = f"{100 * o.cost_error:.0f}%" if o.cost_error is not None else ""
        onset = f"{o.onset_error:+d}" if o.onset_error is not None else ""
        took = f"{o.health_s:.1f}" if o.health_s is not None else ""
        rows.append(f"| {o.case.name} | {exp} | {got} | {verdict} | {det} | {cost} | {onset} | {took} |")
    costs = [o.cost_error for o in outcomes if o.cost_error is not None]
    load = os.getloadavg()
    cost = (
        f"; cost error (stragglers, slow links) median {100 * statistics.median(costs):.0f}% "
        f"(max {100 * max(costs):.0f}%) over {len(costs)} cases"
        if costs
        else ""
    )
    head = (
        f"# Fault-injection suite\n\nMeasured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on a {machine()}; "
        f"{code_version(REPO)}; load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}. "
        f"Command: `{command}`; {len(outcomes)} cases in {wall_s / 60:.1f} min.\n\n"
        f"Overall F1 {summary['f1']:.2f} (precision {summary['precision']:.2f}, recall {summary['recall']:.2f}); "
        f"healthy cases with a warning: {summary['healthy_warned']}, whose note was not said: "
        f"{summary['notes_missing']}{cost}.\n\n"
    )
    multi = multihost_table(outcomes)
    multi = f"\n\n## Multi-host runs\n\n{multi}" if multi else ""
    return head + text + multi + "\n\n## Per case\n\n" + "\n".join(rows) + "\n" + hop_table(outcomes)


HOPS = (
    ("onset_to_entered", "onset -> waiting rank entered"),
    ("entered_to_reported", "entered -> watchdog reported"),
    ("onset_to_closed", "onset -> stream closed"),
    ("reported_to_visible", "reported -> readable"),
    ("closed_to_visible", "closed -> readable"),
    ("visible_to_named", "readable -> health named it"),
    ("poll_s", "one health poll"),
)


def hop_table(outcomes: list[Outcome]) -> str:
    """p50 / p90 of each hop of the live faults' detection, per class (Hops)."""
    live = [o for o in outcomes if o.case.live and o.hops]
    if not live:
        return ""

    def pct(xs: list[float], q: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    lines = [
        "\n## Live faults: where the time to detect goes (p50 / p90, s)\n",
        "| class | runs | hop | p50 | p90 |",
        "|---|---:|---|---:|---:|",
    ]
    for cls in sorted({o.case.live for o in live}):
        runs = [o for o in live if o.case.live == cls]
        detect = [o.detect_s for o in runs if o.detect_s is not None]
        for key, label in (*HOPS, ("detect", "**onset -> named**")):
            xs = detect if key == "detect" else [o.hops[key] for o in runs if key in o.hops]
            if xs:
                lines.append(f"| {cls} | {len(xs)} | {label} | {pct(xs, 0.5):.2f} | {pct(xs, 0.9):.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import tempfile

    p = argparse.ArgumentParser(description="The fault-injection suite, scored.")
    p.add_argument("--only", default="", help="comma-separated case names (or sources: ddp, engine, simulate, ...)")
    p.add_argument("--quick", action="store_true", help="the subset make test runs")
    p.add_argument("--out", default=str(REPO / "benches" / "RESULTS-faults.md"))
    p.add_argument("--work", default=None, help="keep the runs here (default: a temporary directory)")
    p.add_argument("--repeat", type=int, default=1, help="run each selected live case (hang, crash, desync) N times")
    p.add_argument(
        "--auto-profile",
        action="store_true",
        help="the live cases' collector profiles the suspects of its findings, as rankscope collect does by default "
        "(off: a capture changes the profiled rank's steps, which the cost error measures)",
    )
    p.add_argument(
        "--auto-probe",
        action="store_true",
        help="the multi-host runs' collector probes the links a slow-link finding leaves in doubt (--auto-probe)",
    )
    args = p.parse_args(argv)
    selected = cases()
    if args.quick:
        selected = [c for c in selected if c.quick]
    if args.only:
        names = set(args.only.split(","))
        selected = [c for c in selected if c.name in names or c.source in names]
    if args.repeat > 1:  # a latency's p90 needs more than one run
        selected = [
            dataclasses.replace(c, name=f"{c.name}.{k}") if c.live else c
            for c in selected
            for k in range(1, (args.repeat if c.live else 1) + 1)
        ]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rankscope-faults-") as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        outcomes = run_suite(selected, work, auto_profile=args.auto_profile, auto_probe=args.auto_probe)
    text = report(outcomes, time.perf_counter() - t0, " ".join(["python -m benches.faults", *(argv or sys.argv[1:])]))
    print(text)
    Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
