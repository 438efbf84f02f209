"""D/collector.json: written atomically with mode 0600, read back, and ignored once its process is gone."""

import os
import stat

from collector.data import live_collector


def test_write_then_read_round_trips_with_mode_0600(tmp_path):
    target = live_collector.write(tmp_path, "127.0.0.1:40123", True, os.getpid(), tls=True)
    assert target == tmp_path / "collector.json"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert live_collector.read(tmp_path) == live_collector.LiveCollector(
        endpoint="127.0.0.1:40123", token_required=True, pid=os.getpid(), tls=True
    )
    assert [p.name for p in tmp_path.iterdir()] == ["collector.json"]  # no temporary left behind


def test_absent_garbled_or_dead_process_reads_as_none(tmp_path):
    assert live_collector.read(tmp_path) is None
    (tmp_path / "collector.json").write_text("{not json")
    assert live_collector.read(tmp_path) is None
    never = int(open("/proc/sys/kernel/pid_max").read())  # pids are below pid_max: none has this one
    live_collector.write(tmp_path, "127.0.0.1:1", False, never)
    assert live_collector.read(tmp_path) is None, "a collector whose pid is gone must not be dialled"


def test_a_reused_pid_reads_as_none(tmp_path):
    live_collector.write(tmp_path, "127.0.0.1:40123", False, os.getpid())
    body = (tmp_path / "collector.json").read_text().replace('"started": ', '"started": 1')
    (tmp_path / "collector.json").write_text(body)  # as if another process had held this pid before
    assert live_collector.read(tmp_path) is None


def test_remove_leaves_another_collectors_file(tmp_path):
    live_collector.write(tmp_path, "127.0.0.1:2", False, os.getpid())
    live_collector.remove(tmp_path, os.getpid(), "127.0.0.1:1")
    assert live_collector.read(tmp_path) is not None
    live_collector.remove(tmp_path, os.getpid(), "127.0.0.1:2")
    assert not (tmp_path / "collector.json").exists()


def test_a_wildcard_bind_is_dialled_on_loopback():
    assert live_collector.dialable("0.0.0.0", 5) == "127.0.0.1:5"
    assert live_collector.dialable("[::]", 5) == "[::1]:5"
    assert live_collector.dialable("10.0.0.5", 5) == "10.0.0.5:5"
