"""Soak: many rank processes (each a real collector.rank.client.Client) stream for a
while into one collector that is SIGKILLed and restarted on the same port several
times. Every record is stored exactly once (clients spool while it is down and
resend; the collector deduplicates), every rank ends 'finished', and the
collector's RSS stays under a stated bound.

``test_soak_bounded`` (16 ranks, 2 kills, ~20 s of traffic) runs in ``make test``;
``test_soak_long`` (64 ranks, 5 kills, ~5 min) is marked slow and runs in
``make soak``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from collector.data import catalog
from collector.testing.ports import free_port
from collector.tools.launch import CollectorProcess

SETTINGS = ("--flush-interval", "0.1", "--compaction-interval", "1.0")

# One rank: `rate` timers rows per second for `seconds`, step = row number, then RunEnd.
RANK = """
import os, sys, time
from collector.rank.client import Client, ClientConfig
from collector.rank.records import RecordBuffer
from proto import pb
endpoint, spool, rank, world, rate, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
    int(sys.argv[5]), float(sys.argv[6])
release = sys.argv[7]  # exists once the collector's last restart listens
buffer = RecordBuffer()
client = Client(ClientConfig(endpoint=endpoint, spool_dir=spool, flush_interval_s=0.1, backoff_max_s=1.0,
                             spool_after_s=0.5, close_timeout_s=180.0), f"soak-rank-{rank}", buffer)
client.start(pb.Hello(run_id="soak", run_name="soak", rank=rank, world_size=world))
sent, start = 0, time.monotonic()
while (now := time.monotonic() - start) < seconds:
    due = int(now * rate)
    while sent < due:
        buffer.add_row("timers", {"name": "soak", "dur_ns": sent}, step=sent)
        sent += 1
    time.sleep(0.05)
# Close only once the collector is back and has taken what waited for it: a rank that ends while
# the collector is out of its reach spools its rest after a short grace (collector.rank.client: exit
# is not held up), which is what the spool is for, not what this test counts. Beside a CPU hog a
# restart outlasted the traffic, and a rank's reconnection outlasted that grace (55 envelopes spooled).
while not os.path.exists(release):
    time.sleep(0.05)
deadline = time.monotonic() + 300
while client.pending and time.monotonic() < deadline:  # resent and acked by the client's own thread
    time.sleep(0.1)
# generous: a durability check, not a speed one (at load 10-17, 2 of 16 ranks needed over 60 s)
ok = client.close(pb.RunEnd(run_id="soak", rank=rank, status="finished"), timeout_s=180.0)
print(f"rank {rank} sent {sent} dropped {buffer.dropped} all_acked {ok}", flush=True)
sys.exit(0 if ok and buffer.dropped == 0 else 3)
"""


def _rss_bytes(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    match = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(match.group(1)) * 1024 if match else 0


class Collector:
    def __init__(self, data: Path, port: int):
        self.data, self.port = data, port
        self.proc: subprocess.Popen | None = None
        self.max_rss = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def start(self) -> None:
        deadline = time.monotonic() + 60
        while True:  # the port may take a moment to be free again after a SIGKILL
            try:
                self.process = CollectorProcess(self.data, *SETTINGS, port=self.port)
                self.proc = self.process.proc
                return
            except RuntimeError as exc:
                assert time.monotonic() < deadline, f"collector did not restart: {exc}"
                time.sleep(0.5)

    def kill(self) -> None:
        self.process.kill()

    def stop(self) -> None:
        self._stop.set()
        if self.proc and self.proc.poll() is None:
            try:
                assert self.process.stop() == 0
            finally:
                if self.proc.poll() is None:
                    self.proc.kill()

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            if self.proc is not None and self.proc.poll() is None:
                self.max_rss = max(self.max_rss, _rss_bytes(self.proc.pid))


def soak(tmp_path: Path, *, ranks: int, kills: int, seconds: float, rate: int, rss_bound: int) -> None:
    data = tmp_path / "data"
    collector = Collector(data, free_port())
    collector.start()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    release = tmp_path / "collector-back"
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RANK,
                f"127.0.0.1:{collector.port}",
                str(tmp_path / f"spool-{r}"),
                str(r),
                str(ranks),
                str(rate),
                str(seconds),
                str(release),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(ranks)
    ]
    try:
        # kills spread over the traffic, each followed by an immediate restart on the same port
        for _k in range(kills):
            time.sleep(seconds / (kills + 1))
            collector.kill()
            time.sleep(0.5)  # the ranks notice and spool
            collector.start()
        release.touch()
        outcomes = []
        for w in workers:
            out, err = w.communicate(timeout=seconds + 400)
            outcomes.append((w.returncode, out.strip(), err[-1500:]))
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        collector.stop()

    failed = [o for o in outcomes if o[0] != 0]
    assert not failed, failed[:3]
    sent = {
        int(m.group(1)): int(m.group(2)) for _, out, _ in outcomes if (m := re.search(r"rank (\d+) sent (\d+)", out))
    }
    assert len(sent) == ranks
    con = catalog.connect(data)
    rows = dict(con.execute("SELECT rank, count(*) FROM timers WHERE run_id = 'soak' GROUP BY rank").fetchall())
    distinct = con.execute("SELECT count(DISTINCT (rank, step)) FROM timers WHERE run_id = 'soak'").fetchone()[0]
    assert rows == sent, "per-rank counts differ from what the ranks sent"
    assert distinct == sum(sent.values()), "some record is stored twice"
    assert con.execute("SELECT status, n_ranks FROM runs WHERE run_id = 'soak'").fetchone() == ("finished", ranks)
    assert collector.max_rss < rss_bound, f"collector RSS peaked at {collector.max_rss / 2**20:.0f} MiB"
    print(
        f"soak: {ranks} ranks, {kills} kills, {sum(sent.values())} records exactly once, "
        f"collector RSS peak {collector.max_rss / 2**20:.0f} MiB"
    )


def test_soak_bounded(tmp_path):
    soak(tmp_path, ranks=16, kills=2, seconds=20, rate=200, rss_bound=1 << 30)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_soak_long(tmp_path, request):
    # `make test` runs plain `pytest tests`: run only when slow tests were asked for (`make soak`: -m slow)
    if "slow" not in (request.config.getoption("-m") or "") or "not slow" in request.config.getoption("-m"):
        pytest.skip("5-minute soak: run with `make soak` (pytest -m slow)")
    soak(tmp_path, ranks=64, kills=5, seconds=300, rate=200, rss_bound=1 << 30)
