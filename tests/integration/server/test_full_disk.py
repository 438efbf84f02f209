"""A full disk under a real collector (issue 49): its data dir on an 8 MiB tmpfs (root: mounted
here, unmounted in teardown), filled by a file while a rank streams. The collector stops acking
(nothing it cannot make durable is acknowledged), says why once in its log, on /metrics and to
``rankscope health`` ("collector cannot write: disk full"); once the file is deleted it takes the
resent envelopes by itself and says it can write again; every acked record is stored once."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from collector.data import catalog
from collector.server import write_status
from collector.testing import disks
from collector.testing.fake_runs import comm_envelope, hello
from collector.testing.streams import RawStream
from collector.tools.launch import CollectorProcess

ROWS = 2000  # per envelope
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def small_disk(tmp_path):
    try:
        with disks.small_disk(tmp_path / "disk", "8m") as disk:
            (disk / "filler").touch()  # made now: on a disk the collector filled, not even a new name fits
            yield disk
    except disks.DiskUnavailable as exc:
        pytest.skip(str(exc))


def _wait(what: str, check, timeout_s: float = 90.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"within {timeout_s:.0f} s: {what} did not happen")


def _metric(port: int, name: str) -> float | None:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_a_full_disk_stops_acks_says_so_and_resumes_by_itself(small_disk):
    data = small_disk / "data"
    collector = CollectorProcess(data, "--flush-interval", "0.05", "--metrics-port", "0")
    mport = collector.metrics_port
    channel = grpc.insecure_channel(collector.address)
    try:
        envs = [hello("r0", 1, "full", 0, 1)] + [
            comm_envelope("r0", s, "full", 0, s * ROWS, ROWS) for s in range(2, 12)
        ]
        first = RawStream(channel)
        first.send(*envs[:6])
        assert first.wait_acked(range(1, 7), 60), f"the first envelopes were not acked: {first.error}"

        filler = disks.fill(small_disk / "filler", chunk=64 << 10)
        first.send(*envs[6:])
        status = _wait("the collector saying it cannot write", lambda: (write_status.read(data) or {}).get("failing"))
        assert status == "disk full"
        assert not first.acked & set(range(7, 12)), "envelopes were acked that the full disk could not hold"
        assert _wait("rankscope_collector_write_failing 1", lambda: _metric(mport, "rankscope_collector_write_failing"))
        said = [line for line in collector.stderr().splitlines() if "cannot write" in line]
        assert len(said) == 1 and "collector cannot write: disk full" in said[0], collector.stderr()
        health = subprocess.run(
            [sys.executable, "-m", "collector.tools.cli", "health", "full", "--data-dir", str(data)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "collector cannot write: disk full" in health.stdout and health.returncode >= 1, health

        filler.unlink()  # space returns: a resend (as a rank's client makes) is taken without a restart
        second = RawStream(channel)
        second.send(*[e for e in envs if e.seq not in first.acked])
        assert second.wait_acked(set(range(1, 12)) - first.acked, 90), f"not taken after space returned: {second.error}"
        _wait("the status clearing", lambda: not (write_status.read(data) or {}).get("failing"))
        assert _metric(mport, "rankscope_collector_write_failing") == 0
        assert _metric(mport, "rankscope_collector_commit_failures_total") >= 1
        second.finish(60)
    finally:
        channel.close()
        stopped = collector.stop()
    assert stopped == 0, collector.stderr()
    assert "collector can write again" in collector.stderr()
    assert "Traceback" not in collector.stderr(), "a full disk is said in words, not as a traceback"
    con = catalog.connect(data)
    try:
        total, distinct = con.execute("SELECT count(*), count(DISTINCT seq) FROM comm WHERE run_id = 'full'").fetchone()
    finally:
        con.close()
    assert total == distinct == 10 * ROWS
