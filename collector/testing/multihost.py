"""A real training run over several "hosts" (collector/testing/netns.py), its link throttled
at one step and restored at another, for tests and the fault-injection suite:

    run = train_on_hosts(work, hosts=2, ranks_per_host=2, steps=60,
                         throttle=Throttle.parse("1:50mbit@20-40"))
    # several: two links slow at once, or one that flaps (slow 5 loop indexes of every 20)
    train_on_hosts(..., throttle=Throttle.parse_all("1:80mbit@20-25,1:80mbit@40-45,2:80mbit@60"))
    run.data_dir, run.name, run.step_times        # the collector's data dir, the run, rank 0's step times

``run_on_hosts(argv, hosts=2, ranks_per_host=2)`` runs any torchrun-style program (say
``python -m collector.tools.calibrate``) as every rank over the hosts, without a collector.

Every rank (``python -m collector.hook collector/testing/workloads/hosts_train.py``, gloo over
``eth0``, GLOO_SOCKET_IFNAME) runs in its host's namespace under that host's name, the collector
(``rankscope collect --insecure``: nothing outside the namespaces can reach it) in its own; the
throttle is applied and lifted by netns.StepControl when the ranks reach those loop indexes (the
hook's steps count from 1: loop index i is step i + 1). The collector is stopped with SIGTERM
(it commits what it buffered) once the ranks exit; everything is torn down however it ends.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc

from collector.data import queries
from collector.testing import netns

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = REPO / "collector" / "testing" / "workloads"
WORKLOAD = WORKLOADS / "hosts_train.py"
WORLD_WORKLOAD = WORKLOADS / "world_train.py"  # plain DDP / FSDP2 over the world group only
PIPE_WORKLOAD = WORKLOADS / "pipe_train.py"  # the bundled engine's pipeline, stages across hosts
COLLECTOR_PORT = 50051  # the collector's namespace is its own: no port to share
MASTER_PORT = 29500


@dataclass(frozen=True)
class Throttle:
    host: int
    rate: str  # tc's units: 50mbit
    from_step: int  # loop index the link turns slow at
    to_step: int | None = None  # loop index it is restored at

    @classmethod
    def parse(cls, text: str) -> Throttle:
        """``HOST:RATE@STEP[-END]``, e.g. ``1:50mbit@20-40``."""
        match = re.fullmatch(r"(\d+):(\d+(?:\.\d+)?[kmg]?(?:bit|bps))@(\d+)(?:-(\d+))?", text.strip())
        if not match:
            raise ValueError(f"throttle {text!r} is not HOST:RATE@STEP[-END] (e.g. 1:50mbit@20-40)")
        host, rate, first, end = match.groups()
        return cls(int(host), rate, int(first), int(end) if end else None)

    @classmethod
    def parse_all(cls, text: str) -> tuple[Throttle, ...]:
        """Comma-separated throttles: ``1:80mbit@20-25,1:80mbit@40-45``."""
        return tuple(cls.parse(part) for part in text.split(","))


@dataclass
class HostsRun:
    data_dir: Path
    name: str
    step_times: list[float]  # rank 0's seconds per loop index
    out: Path
    qdiscs: dict[str, str]  # each host's eth0 qdisc just after the throttle (empty without one)


def train_on_hosts(
    work: Path,
    *,
    hosts: int,
    ranks_per_host: int,
    steps: int,
    name: str = "hosts",
    throttle: Throttle | tuple[Throttle, ...] | None = None,
    workload_args: tuple[str, ...] = (),
    timeout_s: float = 600,
    auto_profile: bool = False,
    auto_probe: bool = False,
    raw_every: int = 0,
    workload: Path = WORKLOAD,
    at_steps: dict[int, Callable[[netns.Network], None]] | None = None,
    python: str = sys.executable,
    rank_env: dict[str, str] | None = None,
) -> HostsRun:
    """``auto_profile``: let the collector profile the suspects of its live findings (off: a profiled
    rank's steps are not the run's, and the slow-link tests check a cost against step times);
    ``auto_probe``: let it time the links a slow-link finding leaves in doubt (``collect --auto-probe``);
    ``raw_every``: the collector's retention (``collect --raw-every``), and it is stopped only once
    retention has rolled up the run's last step (what it thins is then thinned); ``workload``: the
    training script (hosts_train.py's groups inside and across hosts, WORLD_WORKLOAD's world
    group only, PIPE_WORKLOAD's pipeline stages; all take --ranks-per-host, --steps,
    --control/--pause-at); ``at_steps``: more actions at loop indexes, each given the network
    (say, start a CPU hog in a host: ``net.popen``, killed with the namespaces), run after that
    index's throttles; ``python``, ``rank_env``: the ranks' interpreter and what their environment
    adds (DeepSpeed's venv: benches/_deepspeed_venv.py)."""
    work = Path(work)
    data_dir, out, control = work / "data", work / "out", work / "control"
    world = hosts * ranks_per_host
    with netns.Network(hosts) as net:
        collector = net.popen(
            "collector",
            [sys.executable, "-m", "collector.tools.cli", "collect", "--data-dir", str(data_dir),
             "--host", net.ip("collector"), "--port", str(COLLECTOR_PORT), "--insecure",
             "--auto-profile" if auto_profile else "--no-auto-profile",
             "--auto-probe" if auto_probe else "--no-auto-probe",
             *(["--raw-every", str(raw_every)] if raw_every else [])],
            hostname="collector", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        )  # fmt: skip
        line = collector.stdout.readline()
        if "listening" not in line:
            raise RuntimeError(f"collector did not start: {line!r} {collector.stderr.read()[-2000:]}")
        actions, qdiscs = _throttle_actions(net, throttle, at_steps or {})
        with netns.StepControl(control, actions) as steps_control:
            ranks = []
            for rank in range(world):
                host = net.hosts[rank // ranks_per_host]
                env = {
                    **_rank_env(net, rank, world, ranks_per_host),
                    **(rank_env or {}),  # its PYTHONPATH, say, over the repo's
                    "RANKSCOPE_ENDPOINT": f"{net.ip('collector')}:{COLLECTOR_PORT}",
                    "RANKSCOPE_RUN": name,
                    "RANKSCOPE_SPOOL_DIR": str(work / "spool"),
                }
                argv = [python, "-m", "collector.hook", str(workload), str(out)]
                argv += ["--ranks-per-host", str(ranks_per_host), "--steps", str(steps), *workload_args]
                if actions:
                    argv += ["--control", str(control), "--pause-at", steps_control.pause_at]
                ranks.append(
                    net.popen(host, argv, hostname=host, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
                )  # fmt: skip
            _wait_for_ranks(ranks, timeout_s)
        if steps_control.error is not None:
            raise RuntimeError(f"applying the throttle failed: {steps_control.error}")
        if sorted(steps_control.done) != sorted(actions):
            raise RuntimeError(f"throttle steps acted on {steps_control.done}, planned {sorted(actions)}")
        if raw_every:
            _wait_for_rollup(data_dir, name, timeout_s)
        collector.terminate()
        try:
            collector.wait(timeout=120)
        except subprocess.TimeoutExpired:
            raise RuntimeError("the collector did not stop within 120 s of SIGTERM") from None
    return HostsRun(data_dir, name, json.loads((out / "times.json").read_text()), out, qdiscs)


def _throttle_actions(net: netns.Network, throttle, more: dict) -> tuple[dict, dict[str, str]]:
    """netns.StepControl's actions for ``throttle`` (one, several, or None): per loop index, every
    throttle and restore due then, in order; and the dict each throttle fills with every host's
    qdisc just after it (the evidence: tbf where meant)."""
    due: dict[int, list] = {}
    qdiscs: dict[str, str] = {}
    for t in (throttle,) if isinstance(throttle, Throttle) else (throttle or ()):
        slow = net.hosts[t.host]  # bound now: the actions run later

        def throttled(slow=slow, rate=t.rate) -> None:
            net.throttle(slow, rate=rate)
            qdiscs.update({h: net.qdisc(h) for h in net.hosts})

        due.setdefault(t.from_step, []).append(throttled)
        if t.to_step is not None:
            due.setdefault(t.to_step, []).append(lambda slow=slow: net.restore(slow))

    for step, action in more.items():
        due.setdefault(step, []).append(lambda action=action: action(net))

    def run_all(todo: list) -> None:
        for action in todo:
            action()

    return {step: (lambda todo=todo: run_all(todo)) for step, todo in due.items()}, qdiscs


def _rank_env(net: netns.Network, rank: int, world: int, ranks_per_host: int) -> dict[str, str]:
    """A rank's environment as torchrun would set it, gloo over its host's ``eth0``."""
    return dict(
        os.environ,
        PYTHONPATH=str(REPO),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank % ranks_per_host),
        LOCAL_WORLD_SIZE=str(ranks_per_host),
        MASTER_ADDR=net.ip(net.hosts[0]),
        MASTER_PORT=str(MASTER_PORT),
        GLOO_SOCKET_IFNAME="eth0",
        OMP_NUM_THREADS="1",
    )


def run_on_hosts(
    argv: list[str], *, hosts: int, ranks_per_host: int, throttle: tuple[int, str] | None = None, timeout_s: float = 600
) -> list[str]:
    """``argv`` as every rank of a job over ``hosts`` namespace hosts (no collector), with host
    ``throttle[0]``'s link at rate ``throttle[1]`` throughout where given; each rank's stdout."""
    world = hosts * ranks_per_host
    with netns.Network(hosts) as net:
        if throttle is not None:
            net.throttle(net.hosts[throttle[0]], rate=throttle[1])
        procs = [
            net.popen(net.hosts[rank // ranks_per_host], argv, hostname=net.hosts[rank // ranks_per_host],
                      env=_rank_env(net, rank, world, ranks_per_host), cwd=REPO, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True)
            for rank in range(world)
        ]  # fmt: skip
        return _wait_for_ranks(procs, timeout_s)


def _wait_for_ranks(procs: list[subprocess.Popen], timeout_s: float) -> list[str | None]:
    """Each rank's stdout once it exits 0; RuntimeError naming the first that did not (its stderr's end)."""
    out = []
    for rank, proc in enumerate(procs):
        try:
            stdout, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"rank {rank} did not finish in {timeout_s:.0f} s") from None
        if proc.returncode != 0:
            raise RuntimeError(f"rank {rank}: exit {proc.returncode}: {err[-3000:]}")
        out.append(stdout)
    return out


def _wait_for_rollup(data_dir: Path, name: str, timeout_s: float) -> None:
    """Until the collector's retention has rolled up the run's last step."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        cat = queries.Catalog(data_dir)
        try:
            run_id = queries.resolve_run(cat.con, name)
            rolled = queries.rolled_through(cat, run_id)  # deliveries are thinned before the rollup lands
            last = pc.max(queries.comm_rollup(cat, run_id)["step"]).as_py()
        except queries.UnknownRun:
            rolled = None
        finally:
            cat.close()
        if rolled is not None and rolled >= last:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the collector's retention did not roll up run {name!r} within {timeout_s:.0f} s")
