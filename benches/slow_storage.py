"""Slow storage, measured (issue 49): what fsync delays of 0.2-2 s cost the ranks and the readers.

Target: records lost or stored twice: 0; a rank's step time unchanged by its collector's slow disk;
its un-acked bytes within ``telemetry.max_unacked_bytes`` (then its spool); the catalog reader (what
the dashboard's pages query) still answering.

Method: for each delay, two real collectors side by side on loopback, one whose every fsync first
sleeps that long (``--device wrap``: collector.testing.slow_fsync, the collector process's
``os.fsync`` wrapped; ``--device fuse``: its data dir on a FUSE directory whose fsyncs sleep,
collector.testing.slow_dir), one plain; a real hooked rank streams into each (collector/testing/workloads/
partition_train.py, alone in its world: each step 50 ms asleep, a gloo all_reduce, ``--rows`` timers
rows; it samples its memory, un-acked bytes, stream queue and spool every 0.5 s). Both ranks run the
same ``--seconds`` at once, so the machine's load is the same for both. Meanwhile a reader opens
each data dir's catalog every second and runs the runs list and the run's step analysis (the
Overview's queries), timed. Then the ranks stop, whatever they spooled is resent to their
collector, the collectors stop (SIGTERM) and the timers rows are counted against those made.

    .venv/bin/python -m benches.slow_storage [--delays 0.2,0.5,1,2,0.2-2] [--seconds 45] [--rows 200] [--device fuse]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benches._common import code_version
from collector.data import catalog, queries
from collector.rank.resend import resend_spooled
from collector.testing.partition import WORKLOAD
from collector.testing.ports import free_port, terminate

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def _slow_dir(work: Path, delay: tuple[float, float], log) -> tuple[subprocess.Popen, Path]:
    """A FUSE passthrough of work/disk at work/mnt whose fsyncs sleep (collector.testing.slow_dir)."""
    (work / "disk").mkdir()
    (work / "mnt").mkdir()
    cmd = [sys.executable, "-m", "collector.testing.slow_dir", str(work / "disk"), str(work / "mnt")]
    proc = subprocess.Popen([*cmd, str(delay[0]), str(delay[1]), "49"], cwd=ROOT, stderr=log)
    deadline = time.monotonic() + 20
    while not os.path.ismount(work / "mnt"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the slow directory did not mount (exit {proc.poll()}): see {log.name}")
        time.sleep(0.1)
    return proc, work / "mnt"


def _collector(data: Path, delay: tuple[float, float] | None, log, device: str) -> tuple[subprocess.Popen, str]:
    argv = ["collect", "--data-dir", str(data), "--host", "127.0.0.1", "--port", "0", "--no-auto-profile"]
    if delay and device == "wrap":
        cmd = [sys.executable, "-m", "collector.testing.slow_fsync", str(delay[0]), str(delay[1]), "49", *argv]
    else:
        cmd = [sys.executable, "-m", "collector.tools.cli", *argv]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    match = re.search(r"listening on \S+:(\d+) ", line)
    if not match:
        raise RuntimeError(f"collector did not start: {line!r}")
    return proc, f"127.0.0.1:{match.group(1)}"


def _rank(work: Path, endpoint: str, rows: int) -> subprocess.Popen:
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        OMP_NUM_THREADS="1",
        RANKSCOPE_ENDPOINT=endpoint,
        RANKSCOPE_RUN=work.name,
        RANKSCOPE_SPOOL_DIR=str(work / "spool"),
    )
    argv = [sys.executable, "-m", "collector.hook", str(WORKLOAD), str(work / "out"), "--stop", str(work / "stop")]
    argv += ["--rows", str(rows)]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _reader(data: Path, name: str, stop: threading.Event, times: list[float], errors: list[str]) -> None:
    while not stop.wait(1.0):
        t0 = time.monotonic()
        try:
            cat = queries.Catalog(data)
            try:
                runs = queries.list_runs(cat)
                mine = runs[runs.name == name]
                if len(mine):
                    queries.step_analysis(cat, mine.run_id.iloc[0])
            finally:
                cat.close()
        except Exception as e:  # a reader error is a result here, counted
            errors.append(str(e)[:200])
            continue
        times.append(time.monotonic() - t0)


def _stored(data: Path, name: str) -> tuple[int, int]:
    con = catalog.connect(data)
    try:
        row = con.execute(
            "SELECT count(*), count(DISTINCT (t.step, t.name)) FROM timers t JOIN runs r USING (run_id) "
            "WHERE r.name = ?",
            [name],
        ).fetchone()
    finally:
        con.close()
    return int(row[0]), int(row[1])


def one(tmp: Path, delay: tuple[float, float], seconds: float, rows: int, device: str = "wrap") -> dict:
    """The slow and the plain collector side by side for ``seconds``; each side's figures. ``device``
    "fuse": the slow collector's data dir is on a slow directory (collector.testing.slow_dir), not
    its own fsync wrapped; the plain one's on the same disk beneath, through no FUSE."""
    sides = {"slow": delay, "plain": None}
    procs, ranks, readers, stop, mounts = {}, {}, {}, threading.Event(), []
    logs = {s: open(tmp / f"{s}.log", "w") for s in sides}
    try:
        for side, d in sides.items():
            work = tmp / side
            work.mkdir()
            data = work / "data"
            if d and device == "fuse":
                mounts.append(_slow_dir(work, d, logs[side]))
                data = mounts[-1][1] / "data"
            procs[side] = _collector(data, d, logs[side], device)
            ranks[side] = _rank(work, procs[side][1], rows)
            readers[side] = ([], [], None)
            t = threading.Thread(target=_reader, args=(data, side, stop, *readers[side][:2]), daemon=True)
            readers[side] = (*readers[side][:2], t, data)
            t.start()
        time.sleep(seconds)
        for side in sides:
            (tmp / side / "stop").write_text("")
        errs = {side: ranks[side].communicate(timeout=300)[1] for side in sides}
        stop.set()
        out = {}
        for side in sides:
            work = tmp / side
            if ranks[side].returncode != 0:
                raise RuntimeError(f"{side} rank failed: {errs[side][-2000:]}")
            delivered, left = resend_spooled(work / "spool", procs[side][1])
            report = json.loads((work / "out" / "rank-0.json").read_text())
            terminate(procs[side][0], timeout=300)
            stored, distinct = _stored(readers[side][3], side)
            times, reader_errors, _, _ = readers[side]
            out[side] = {
                "code": procs[side][0].returncode,
                "steps": np.array(report["step_s"]),
                "samples": report["samples"],
                "made": report["rows"],
                "dropped": report["dropped"],
                "stored": stored,
                "distinct": distinct,
                "resent_after": delivered,
                "spool_left": left,
                "reads": np.array(times or [float("nan")]),
                "reader_errors": reader_errors,
            }
        return out
    finally:
        stop.set()
        for side in procs:
            terminate(procs[side][0], timeout=60)
        for side in ranks:
            if ranks[side].poll() is None:
                ranks[side].kill()
        for proc, mount in mounts:  # after the collector that wrote there
            subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)
            terminate(proc, timeout=30)
        for log in logs.values():
            log.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--delays", default="0.2,0.5,1,2,0.2-2", help="fsync seconds: fixed, or LOW-HIGH (uniform)")
    p.add_argument("--seconds", type=float, default=45.0)
    p.add_argument("--rows", type=int, default=200)
    p.add_argument(
        "--device",
        choices=("wrap", "fuse"),
        default="wrap",
        help="wrap: the slow collector's os.fsync sleeps first; fuse: its data dir is on a FUSE passthrough whose "
        "fsyncs sleep (collector.testing.slow_dir: needs libfuse2, fusepy and root)",
    )
    a = p.parse_args(argv)
    started, bad = time.strftime("%H:%M", time.gmtime()), False
    print(
        "| fsync | step p50 / p99 slow vs plain | un-acked max | stream queue max | spool max | "
        "reader p50 / max slow vs plain | rows made / stored / twice / lost (slow; plain) | resent at the end |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for text in a.delays.split(","):
        low, _, high = text.partition("-")
        delay = (float(low), float(high or low))
        with tempfile.TemporaryDirectory(prefix="rankscope-slowdisk-") as tmp:
            got = one(Path(tmp), delay, a.seconds, a.rows, a.device)
        s, n = got["slow"], got["plain"]

        def ms(x):
            return f"{1e3 * x:.0f}"

        def rows(side):
            lost = side["made"] - side["stored"] - side["dropped"]
            return f"{side['made']:,} / {side['stored']:,} / {side['stored'] - side['distinct']} / {lost}"

        print(
            f"| {text} s | {ms(np.median(s['steps']))} / {ms(np.percentile(s['steps'], 99))} ms vs "
            f"{ms(np.median(n['steps']))} / {ms(np.percentile(n['steps'], 99))} ms | "
            f"{max(x['unacked'] for x in s['samples']) / MIB:.2f} MiB | {max(x['queued'] for x in s['samples'])} | "
            f"{max(x['spool'] for x in s['samples']) / MIB:.2f} MiB | "
            f"{ms(np.median(s['reads']))} / {ms(s['reads'].max())} ms vs {ms(np.median(n['reads']))} / "
            f"{ms(n['reads'].max())} ms | {rows(s)}; {rows(n)} | {s['resent_after']} envelopes |",
            flush=True,
        )
        for side in (s, n):
            bad |= side["stored"] != side["distinct"] or side["stored"] + side["dropped"] != side["made"]
            bad |= bool(side["reader_errors"]) or side["spool_left"] != 0 or side["code"] != 0
            if side["reader_errors"]:
                print(f"reader errors: {side['reader_errors'][:3]}")
    load = os.getloadavg()
    slow = "os.fsync wrapped in the slow collector" if a.device == "wrap" else "its data dir on a FUSE slow directory"
    print(
        f"\nslow side: {slow}; {code_version(ROOT)}; {platform.node()}, {os.cpu_count()} cores, "
        f"load {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the end; Python {platform.python_version()}; {started}-"
        f"{time.strftime('%H:%M UTC %Y-%m-%d', time.gmtime())}"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
