"""`rankscope import --watch DIR` as a real process over a real data dir: 1,000 files
dropped while it runs and 100 dropped while it was stopped are each ingested exactly
once; corrupt files are named and skipped without being retried; a dropped archive
restores its run once.

Split by tier: the pure-function tests are in tests/unit/tools/test_watch.py."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from collector.data.codec import encode_batch
from collector.rank import spool
from collector.testing.collectors import live_collector
from collector.tools.importers.sink import envelope
from proto import pb
from tests._import_util import FIXTURE, copy_fixture, query, rankscope

SPOOL_RUN = "spooled"
WAIT_S = 120  # a bound for a hung watcher, not a timing expectation


def _watch_args(folder, data, *extra) -> list[str]:
    return [
        sys.executable,
        "-m",
        "collector.tools.cli",
        "import",
        "--watch",
        str(folder),
        "--data-dir",
        str(data),
        "--settle",
        "0.3",
        "--run",
        "dropped",
        *extra,
    ]


def _watch(folder, data) -> subprocess.Popen:
    return subprocess.Popen(_watch_args(folder, data), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _watch_once(folder, data) -> subprocess.CompletedProcess:
    return subprocess.run(_watch_args(folder, data, "--once"), capture_output=True, text=True, timeout=WAIT_S)


def _drop_spool(folder, i: int) -> None:
    """A spool file as a rank's client leaves it: Hello + one monitor batch of 2 rows."""
    client = f"client-{i}"
    hello = pb.Hello(run_id=SPOOL_RUN, run_name=SPOOL_RUN, rank=0, world_size=1, source="hook")
    batch = encode_batch(
        "monitor",
        SPOOL_RUN,
        0,
        {"step": [1, 2], "tag": [f"spool/{i}"] * 2, "value": [float(i), i + 0.5], "samples": [8, 16]},
    )
    spool.write(folder, client, [envelope(client, 1, hello=hello), envelope(client, 2, table=batch)])


def _drop_csv(folder, i: int) -> None:
    """A csv_monitor file, written under a hidden name and renamed into place."""
    path = folder / "csv" / f"val_{i}.csv"
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_name(f".{path.name}")
    tmp.write_text(f"step,val_{i}\n8,{i}\n16,{i}.5\n")
    os.replace(tmp, path)


def _drop(folder, numbers) -> None:
    for i in numbers:
        (_drop_spool if i % 2 else _drop_csv)(folder, i)


def _monitor_rows(data) -> int:
    if not (data / "catalog.duckdb").exists() and not (data / "parquet").exists():
        return 0
    return query(data, "SELECT count(*) FROM monitor")[0][0]


def _stop(proc: subprocess.Popen) -> tuple[str, str]:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out, err


def _assert_each_file_once(data, numbers) -> None:
    rows = query(data, "SELECT tag, count(*), list(value ORDER BY samples) FROM monitor GROUP BY tag")
    by_tag = {tag: (n, values) for tag, n, values in rows}
    want = {(f"spool/{i}" if i % 2 else f"val_{i}"): (2, [float(i), i + 0.5]) for i in numbers}
    assert by_tag == want


def test_thousand_files_while_running_and_hundred_while_stopped(tmp_path):
    folder, data = tmp_path / "in", tmp_path / "data"
    folder.mkdir()
    proc = _watch(folder, data)
    try:
        assert "watching" in proc.stdout.readline()
        _drop(folder, range(1000))
        deadline = time.monotonic() + WAIT_S
        while _monitor_rows(data) < 2000 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
    finally:
        _, err = _stop(proc)
    assert "skipped" not in err
    _assert_each_file_once(data, range(1000))

    _drop(folder, range(1000, 1100))
    shutil.copy(next(folder.glob("client-1-*.rsspool")), folder / "client-1-copy.rsspool")  # same envelopes
    done = _watch_once(folder, data)
    assert done.returncode == 0, done.stderr
    _assert_each_file_once(data, range(1100))
    assert query(data, "SELECT count(*) FROM runs WHERE run_id = ?", [SPOOL_RUN])[0][0] == 1

    again = _watch_once(folder, data)
    assert "stopped after 0 files" in again.stdout
    _assert_each_file_once(data, range(1100))


def test_corrupt_files_are_named_once_and_the_rest_ingested(tmp_path):
    folder, data = copy_fixture(tmp_path / "in"), tmp_path / "data"
    (folder / "generate.py").unlink()
    (folder / "ds_config.json").unlink()
    (folder / "broken.csv").write_text("step,broken\n8,1.5\n16,oops\n")
    events = next(folder.rglob("events.out.tfevents*"))
    events.write_bytes(events.read_bytes()[: events.stat().st_size // 2])
    (folder / "comm.parquet").write_bytes((FIXTURE / "comms_summary_rank0.json").read_bytes()[:50])
    (folder / "cut.rsspool").write_bytes(spool.MAGIC + b"\x10\x00\x00\x00abc")
    first = _watch_once(folder, data)
    assert first.returncode == 0, first.stderr
    for name, what in (
        (folder / "broken.csv", ":line 3: not a number"),
        (events, ":record"),
        (folder / "comm.parquet", ": unreadable Parquet"),
        (folder / "cut.rsspool", ""),
    ):
        assert f"{name}{what}" in first.stderr
    (val,) = query(data, "SELECT list(value ORDER BY samples) FROM monitor WHERE tag = 'broken'")[0]
    assert val == [1.5]
    assert query(data, "SELECT count(*) FROM comm")[0][0] > 0
    assert query(data, "SELECT count(*) FROM flops")[0][0] > 0
    second = _watch_once(folder, data)
    assert "skipped" not in second.stderr and "stopped after 0 files" in second.stdout


def test_dropped_archive_restores_its_run_once(tmp_path):
    src = tmp_path / "src"
    assert rankscope("import", FIXTURE, "--run", "orig", "--data-dir", src) == 0
    (run_id,) = query(src, "SELECT run_id FROM runs")[0]
    folder, data = tmp_path / "in", tmp_path / "data"
    folder.mkdir()
    assert rankscope("export", "--archive", run_id, folder / "a.rsarchive", "--data-dir", src) == 0
    shutil.copy(folder / "a.rsarchive", folder / "b.rsarchive")
    done = _watch_once(folder, data)
    assert done.returncode == 0, done.stderr
    assert query(data, "SELECT run_id, name, source FROM runs") == [(run_id, "orig", "import")]
    for table in ("comm", "monitor", "flops"):
        sql = f"SELECT * EXCLUDE (run_id) FROM {table} WHERE run_id = ? ORDER BY ALL"
        assert query(data, sql, [run_id]) == query(src, sql, [run_id]), table


def test_watch_through_a_live_collector(tmp_path):
    folder, data = tmp_path / "in", tmp_path / "data"
    folder.mkdir()
    _drop(folder, range(10))
    with live_collector(data) as (endpoint, _):
        assert rankscope("import", "--watch", folder, "--endpoint", endpoint, "--once", "--settle", "0.1") == 0
        assert rankscope("import", "--watch", folder, "--endpoint", endpoint, "--once", "--settle", "0.1") == 0
    _assert_each_file_once(data, range(10))


def _add_scalars(writer, tag: str, samples) -> None:
    for n in samples:
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=n / 8)])
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=n, summary=summary))
    writer.flush()


def test_watch_follows_files_deepspeed_appends_to(tmp_path):
    folder, data = tmp_path / "in", tmp_path / "data"
    folder.mkdir()
    csv = folder / "Train_Samples_loss.csv"
    csv.write_text("step,loss\n8,1.0\n16,0.9\n")
    writer = EventFileWriter(str(folder))
    _add_scalars(writer, "Train/Samples/lr", [8, 16, 24])
    shutil.copy(FIXTURE / "flops_profile.txt", folder / "flops_profile.txt")
    assert _watch_once(folder, data).returncode == 0

    with open(csv, "a") as f:
        f.write("24,0.8\n32,oops\n40,0.7\n")
    _add_scalars(writer, "Train/Samples/lr", [32, 40])
    writer.close()
    (folder / "flops_profile.txt").write_text((FIXTURE / "flops_profile.txt").read_text().replace("Linear", "Lin"))
    grown = _watch_once(folder, data)
    assert grown.returncode == 0, grown.stderr
    assert f"{csv}:line 5: not a number" in grown.stderr
    assert "flops_profile.txt changed after it was ingested (not by appending); not read again" in grown.stderr
    rows = query(data, "SELECT tag, list(samples ORDER BY samples) FROM monitor GROUP BY tag ORDER BY tag")
    assert rows == [("Train/Samples/loss", [8, 16, 24, 40]), ("Train/Samples/lr", [8, 16, 24, 32, 40])]
    assert query(data, "SELECT count(*) FROM flops WHERE module_type = 'Lin'")[0][0] == 0

    again = _watch_once(folder, data)
    assert "stopped after 0 files" in again.stdout and "skipped" not in again.stderr
    assert query(data, "SELECT count(*) FROM monitor")[0][0] == 9


def test_hostile_files_beside_good_ones_are_reported_once_and_the_watcher_keeps_running(tmp_path):
    folder, data = tmp_path / "in", tmp_path / "data"
    folder.mkdir()
    _drop(folder, range(6))
    hostile = {
        folder / "csv" / "huge_step.csv": "step = 9223372036854775808 does not fit in a 64-bit integer",
        folder / "csv" / "big_field.csv": "field larger than field limit",
        folder / "undecodable.rsspool": "",
        folder / "bad_batch.rsspool": "table.rows declares 1000000 rows but the batch carries no column",
    }
    (folder / "csv" / "huge_step.csv").write_text("step,huge_step\n9223372036854775808,1.0\n")
    (folder / "csv" / "big_field.csv").write_text('step,big_field\n8,"' + "x" * (200 << 10) + '"\n')
    (folder / "undecodable.rsspool").write_bytes(spool.MAGIC + b"\x00" * 4 + b"\x08\x00\x00\x00" + b"\xff" * 8)
    batch = pb.TableBatch(table="monitor", run_id=SPOOL_RUN, rank=0, rows=1_000_000)  # no columns at all
    spool.write(folder, "hostile", [envelope("hostile", 1, table=batch)])
    os.replace(next(folder.glob("*hostile*.rsspool")), folder / "bad_batch.rsspool")

    proc = _watch(folder, data)
    try:
        deadline = time.monotonic() + WAIT_S
        while _monitor_rows(data) < 12 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # a few more scans: nothing is retried or reported again
        assert proc.poll() is None, proc.communicate()
    finally:
        _, err = _stop(proc)
    _assert_each_file_once(data, range(6))
    for path, says in hostile.items():
        lines = [line for line in err.splitlines() if str(path) in line]
        assert len(lines) == 1 and says in lines[0], (path, lines, err)
    again = _watch_once(folder, data)
    assert again.returncode == 0 and "skipped" not in again.stderr, again.stderr
    _assert_each_file_once(data, range(6))
