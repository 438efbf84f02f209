"""A real run whose ranks are cut off from the collector for a while, then healed, for the
partition test and bench (issue 49):

    run = partition_run(work, ranks=2, warm_s=8, partition_s=25, after_s=15)
    run.data_dir, run.name, run.reports       # the collector's data dir, the run, each rank's report
    run.cut_at, run.healed_at                 # time.time() of the cut and the heal
    got = outcome(run)                        # rows stored / distinct / dropped / made, findings, health
    phases(run)                               # the ranks' samples before, during and after the cut

The collector runs in its own network namespace and the ranks (``python -m collector.hook
workloads/partition_train.py``, gloo between them over their host's ``eth0``) in a host's
(collector.testing.netns); ``warm_s`` after the ranks reached their first step the collector's
link is partitioned (``Network.partition``: every packet dropped both ways, so the ranks' stream
hangs as in a real partition, rather than being refused), ``partition_s`` later healed; the ranks
train on for ``after_s`` and stop (a stop file), the collector is stopped with SIGTERM once they
exited. ``max_spool_bytes``: each rank's spool limit (else the default).

Each rank's report (workloads/partition_train.py) has its step times and, every 0.5 s, its
memory, the client's un-acked bytes, its stream's queue and its spool files' bytes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from collector.testing import netns
from collector.testing.multihost import COLLECTOR_PORT, REPO, WORKLOADS, _rank_env

WORKLOAD = WORKLOADS / "partition_train.py"


@dataclass
class PartitionRun:
    data_dir: Path
    name: str
    reports: list[dict]  # per rank, workloads/partition_train.py's report
    cut_at: float  # time.time() of the cut and of the heal (the ranks' samples are on the same clock)
    healed_at: float
    ranks_stderr: list[str] = field(default_factory=list)
    collector_log: str = ""


def partition_run(
    work: Path,
    *,
    ranks: int = 2,
    warm_s: float = 8.0,
    partition_s: float = 25.0,
    after_s: float = 15.0,
    step_ms: float = 50.0,
    rows: int = 200,
    max_spool_bytes: int | None = None,
    name: str = "partitioned",
    timeout_s: float = 300.0,
) -> PartitionRun:
    work = Path(work)
    data_dir, out, stop = work / "data", work / "out", work / "stop"
    out.mkdir(parents=True, exist_ok=True)
    with netns.Network(hosts=1) as net:
        host = net.hosts[0]
        log_path = work / "collector.log"
        with open(log_path, "w") as log:
            collector = net.popen(
                "collector",
                [sys.executable, "-m", "collector.tools.cli", "collect", "--data-dir", str(data_dir),
                 "--host", net.ip("collector"), "--port", str(COLLECTOR_PORT), "--insecure",
                 "--no-auto-profile", "--no-auto-probe"],
                hostname="collector", stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO,
            )  # fmt: skip
        line = collector.stdout.readline()
        if "listening" not in line:
            raise RuntimeError(f"collector did not start: {line!r} {log_path.read_text()[-2000:]}")
        procs = []
        for rank in range(ranks):
            env = {
                **_rank_env(net, rank, ranks, ranks),
                "RANKSCOPE_ENDPOINT": f"{net.ip('collector')}:{COLLECTOR_PORT}",
                "RANKSCOPE_RUN": name,
                "RANKSCOPE_SPOOL_DIR": str(work / "spool"),
            }
            argv = [sys.executable, "-m", "collector.hook", str(WORKLOAD), str(out), "--stop", str(stop),
                    "--step-ms", str(step_ms), "--rows", str(rows)]  # fmt: skip
            if max_spool_bytes:
                argv += ["--max-spool-bytes", str(max_spool_bytes)]
            procs.append(
                net.popen(host, argv, hostname=host, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
            )  # fmt: skip
        try:
            _wait_until(lambda: any(out.glob("started-*")) or any(p.poll() is not None for p in procs), 120)
            time.sleep(warm_s)
            cut_at = time.time()
            net.partition("collector")
            time.sleep(partition_s)
            net.heal("collector")
            healed_at = time.time()
            time.sleep(after_s)
            stop.write_text("")
            errs = []
            for proc in procs:
                try:
                    _, err = proc.communicate(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    _, err = proc.communicate()
                errs.append(err)
        finally:
            stop.write_text("")
        collector.terminate()
        try:
            collector.wait(timeout=120)
        except subprocess.TimeoutExpired:
            raise RuntimeError("the collector did not stop within 120 s of SIGTERM") from None
        failed = [(r, p.returncode, e[-3000:]) for r, (p, e) in enumerate(zip(procs, errs)) if p.returncode != 0]
        if failed:
            raise RuntimeError(f"ranks failed: {failed}")
    reports = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(ranks)]
    return PartitionRun(data_dir, name, reports, cut_at, healed_at, errs, log_path.read_text())


def _wait_until(done, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {timeout_s} s")
        time.sleep(0.1)


@dataclass
class Outcome:
    """What the collector kept of a partitioned run, and what it says about it."""

    run_id: str
    stored: int  # timers rows stored
    distinct: int  # of them distinct (rank, step, name)
    dropped: int  # rows the ranks counted as dropped (their RunEnds)
    made: int  # timers rows the ranks made
    found: list  # findings.for_run's Findings
    health: subprocess.CompletedProcess  # `rankscope health RUN`


def outcome(run: PartitionRun) -> Outcome:
    from collector.data import catalog, findings, queries

    con = catalog.connect(run.data_dir)
    try:
        run_id, stored, distinct = con.execute(
            "SELECT r.run_id, count(*), count(DISTINCT (t.rank, t.step, t.name)) FROM timers t "
            "JOIN runs r USING (run_id) WHERE r.name = ? GROUP BY 1",
            [run.name],
        ).fetchone()
        dropped = con.execute("SELECT coalesce(sum(dropped_records), 0) FROM ranks WHERE run_id = ?", [run_id])
        dropped = int(dropped.fetchone()[0])
    finally:
        con.close()
    cat = queries.Catalog(run.data_dir)
    try:
        found = findings.for_run(cat, run_id)
    finally:
        cat.close()
    health = subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", "health", run_id, "--data-dir", str(run.data_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    made = sum(r["rows"] for r in run.reports)
    return Outcome(run_id, stored, distinct, dropped, made, found, health)


def phases(run: PartitionRun) -> dict[str, list]:
    """Each rank's samples split into before the cut, during it and after the heal."""
    out = {"before": [], "during": [], "after": []}
    for report in run.reports:
        for s in report["samples"]:
            phase = "before" if s["t"] < run.cut_at else "during" if s["t"] < run.healed_at else "after"
            out[phase].append(s | {"rank": report["rank"]})
    return out
