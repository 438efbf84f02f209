"""Resending a dead process's spool file to a real collector, exactly once, when part of it cannot
be delivered: an envelope the collector refuses (seq 3 of 5) or a record that does not decode is set
aside in the file's side file (kept, counted, logged once), the rest is delivered, the file is done
with, and one bad file never holds up another writer's good one.

Split by tier: the pure-function tests are in tests/unit/rank/test_spool_resend.py."""

from __future__ import annotations

import logging
import os
import subprocess
import time
from pathlib import Path

from collector.data import catalog, codec
from collector.rank import spool
from collector.rank.client import resend_spooled
from collector.testing.collectors import live_collector
from proto import pb
from tests.unit.rank.test_spool_resend import _write_raw

ROWS = 10  # per table envelope


def _dead_pid() -> int:
    dead = subprocess.Popen(["true"])
    dead.wait()
    return dead.pid


def _envelopes(client_id: str, run: str, tables: int) -> list[pb.Envelope]:
    """A Hello (seq 1) and ``tables`` timers batches of ROWS rows (seq 2...), steps numbered apart."""
    envs = [
        pb.Envelope(
            schema_version=1, client_id=client_id, seq=1, hello=pb.Hello(run_id=run, run_name=run, rank=0, world_size=1)
        )
    ]
    for i in range(tables):
        steps = list(range(i * ROWS, (i + 1) * ROWS))
        cols = {"step": steps, "name": ["fwd"] * ROWS, "start_ns": steps, "dur_ns": [1000] * ROWS}
        batch = codec.encode_batch("timers", run, 0, cols)
        envs.append(pb.Envelope(schema_version=1, client_id=client_id, seq=i + 2, table=batch))
    return envs


def _steps(data_dir: Path) -> dict[str, list[int]]:
    con = catalog.connect(data_dir)
    try:
        rows = con.execute("SELECT r.name, t.step FROM timers t JOIN runs r USING (run_id) ORDER BY 1, 2").fetchall()
    finally:
        con.close()
    out: dict[str, list[int]] = {}
    for name, step in rows:
        out.setdefault(name, []).append(step)
    return out


def test_a_refused_envelope_is_set_aside_and_the_rest_of_the_file_delivered_once(tmp_path, caplog):
    spool_dir = tmp_path / "spool"
    cid = f"{spool.local_host_id()}.{_dead_pid()}.refused"
    envs = _envelopes(cid, "old-run", tables=4)  # seqs 1..5
    envs[2].table.table = "no_such_table"  # seq 3: the collector refuses it (INVALID_ARGUMENT naming seq 3)
    with live_collector(tmp_path / "data") as (endpoint, data_dir):
        path = spool.write(spool_dir, cid, envs, endpoint)
        with caplog.at_level(logging.WARNING, logger="rankscope.client"):
            assert resend_spooled(spool_dir, endpoint) == (1, 0)
            assert resend_spooled(spool_dir, endpoint) == (0, 0)  # nothing left to send, nothing sent twice
    assert _steps(data_dir) == {"old-run": [s for s in range(4 * ROWS) if not ROWS <= s < 2 * ROWS]}
    assert not path.exists() and not list(spool_dir.glob(f"*{spool.SUFFIX}*claimed*"))
    (side,) = spool_dir.glob(f"*{spool.QUARANTINE_SUFFIX}")
    kept, bad = spool.scan(side)
    assert [e.seq for e in kept] == [3] and kept[0].table.table == "no_such_table" and bad == []
    aside = [r.getMessage() for r in caplog.records if "cannot be delivered" in r.getMessage()]
    assert len(aside) == 1 and "seq 3 refused by the collector" in aside[0] and str(side) in aside[0], aside
    summary = [r.getMessage() for r in caplog.records if r.name == "rankscope.client" and "resent" in r.getMessage()]
    assert len(summary) == 1, summary
    assert "resent 30 record(s) of 1 earlier run(s) spooled for this endpoint (old-run)" in summary[0], summary
    said = [r.getMessage() for r in caplog.records if r.name == "rankscope.collector"]
    assert said and "resent 30 records of 1 earlier run spooled for this endpoint" in said[-1], said
    assert "1 record(s) set aside" in summary[0], summary


def test_an_undecodable_record_is_set_aside_and_another_writers_file_still_delivers(tmp_path, caplog):
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    pid = _dead_pid()
    damaged = f"{spool.local_host_id()}.{pid}.aaaa"  # sorts first: resent before the good one
    good = f"{spool.local_host_id()}.{pid}.zzzz"
    with live_collector(tmp_path / "data") as (endpoint, data_dir):
        records = [e.SerializeToString() for e in _envelopes(damaged, "damaged-run", tables=3)]
        records.insert(2, b"\xff\xff\xff\xff not an envelope")  # between seq 2 and seq 3
        damaged_path = spool_dir / f"{damaged}-{1:012d}-{4:012d}{spool.SUFFIX}"
        _write_raw(damaged_path, endpoint, records)
        good_path = spool.write(spool_dir, good, _envelopes(good, "good-run", tables=1), endpoint)
        with caplog.at_level(logging.WARNING, logger="rankscope.client"):
            assert resend_spooled(spool_dir, endpoint) == (2, 0)  # never raises, both files done
    assert _steps(data_dir) == {"damaged-run": list(range(3 * ROWS)), "good-run": list(range(ROWS))}
    assert not damaged_path.exists() and not good_path.exists()
    assert not list(spool_dir.glob(f"*{spool.SUFFIX}*claimed*")), "no file is left claimed"
    (side,) = spool_dir.glob(f"*{spool.QUARANTINE_SUFFIX}")
    assert spool.unclaimed_name(side).startswith(damaged)
    kept, bad = spool.scan(side)
    assert kept == [] and [raw for raw, _ in bad] == [b"\xff\xff\xff\xff not an envelope"]
    aside = [r.getMessage() for r in caplog.records if "cannot be delivered" in r.getMessage()]
    assert len(aside) == 1 and "1 undecodable" in aside[0], aside


def test_a_zombie_writers_file_is_an_orphan(tmp_path):
    """A writer that has exited but is not yet reaped (a rank SIGKILLed with its torchrun, until init
    reaps it) writes nothing more: its file is resent now, not left for a process that is gone."""
    child = subprocess.Popen(["true"])  # exits at once; not waited for until the end: a zombie
    pid = child.pid
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        else:
            raise AssertionError(f"the child {pid} did not become a zombie in 30 s")
        client_id = f"{spool.local_host_id()}.{pid}.abcd"
        spool.write(tmp_path, client_id, [pb.Envelope(schema_version=1, client_id=client_id, seq=1)], "e:1")
        assert list(spool.orphans(tmp_path, "e:1")) == [client_id]
        own = f"{spool.local_host_id()}.{os.getpid()}.abcd"  # a live writer's file is not
        spool.write(tmp_path, own, [pb.Envelope(schema_version=1, client_id=own, seq=1)], "e:1")
        assert list(spool.orphans(tmp_path, "e:1")) == [client_id]
    finally:
        child.wait()
