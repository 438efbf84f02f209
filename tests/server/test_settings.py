"""The collector's settings object (collector.server.settings) and serve(): a bad setting is refused
by name before anything is created; serve runs a real collector until told to stop, tells its
caller where it listens, and raises (never prints, never returns an exit code) when it cannot start."""

import socket
import threading

import grpc
import pytest

from collector.data.config import ConfigError
from collector.data.security import SecurityConfigError
from collector.server.compaction import CompactionConfig
from collector.server.limits import StreamLimits
from collector.server.serve import serve
from collector.server.settings import CollectorSettings, MetricsSettings, SecuritySettings, SettingsError
from collector.server.store import StoreConfig
from proto import pb, pb_grpc


def test_a_bad_setting_is_named_by_its_dotted_key(tmp_path):
    with pytest.raises(ConfigError, match=r"^streams\.rows_per_s: must be > 0 \(got 0\.0\)$"):
        CollectorSettings(data_dir=tmp_path, streams=StreamLimits(rows_per_s=0.0))
    with pytest.raises(ConfigError, match=r"^store\.flush_interval: must be <= 5 \(got 10\.0\)$"):
        CollectorSettings(data_dir=tmp_path, store=StoreConfig(flush_interval=10.0))
    with pytest.raises(ConfigError, match=r"^port: must be an integer \(got '50051'\)$"):
        CollectorSettings(data_dir=tmp_path, port="50051")
    with pytest.raises(ConfigError, match=r"--raw-every .* --writer-id"):
        CollectorSettings(data_dir=tmp_path, writer="east", compaction=CompactionConfig(raw_every=10))
    with pytest.raises(ValueError, match="writer id 'East' is not allowed"):
        CollectorSettings(data_dir=tmp_path, writer="East")
    with pytest.raises(SecurityConfigError, match="token must be printable ASCII"):
        SecuritySettings(token="two words")
    assert not any(tmp_path.iterdir())  # refused before anything was created


def test_the_bind_policy_is_part_of_the_settings(tmp_path):
    with pytest.raises(SecurityConfigError, match=r"refusing to listen on 0\.0\.0\.0 without a token"):
        CollectorSettings(data_dir=tmp_path, host="0.0.0.0")
    wide_open = CollectorSettings(data_dir=tmp_path, host="0.0.0.0", security=SecuritySettings(insecure=True))
    assert any("no token" in w for w in wide_open.bind_warnings())
    assert CollectorSettings(data_dir=tmp_path).bind_warnings() == []
    assert CollectorSettings(data_dir=tmp_path, host="::1", port=7).address == "[::1]:7"


def test_serve_runs_a_collector_until_stopped_and_tells_where_it_listens(tmp_path):
    stop, ready, events = threading.Event(), threading.Event(), []

    def on_ready(listening):
        events.append(listening)
        ready.set()

    settings = CollectorSettings(data_dir=tmp_path / "data", port=0)
    done: list[BaseException | None] = []

    def run():
        try:
            serve(settings, stop, on_ready=on_ready, on_stopping=lambda: events.append("stopping"))
            done.append(None)
        except BaseException as exc:  # the test below names it
            done.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert ready.wait(60), done
        (listening,) = events
        assert listening.host == "127.0.0.1" and listening.port > 0 and listening.metrics_port is None
        assert not listening.tls and not listening.token_required
        assert listening.data_dir == (tmp_path / "data").resolve()
        with grpc.insecure_channel(f"127.0.0.1:{listening.port}") as channel:
            reply = pb_grpc.CollectorStub(channel).Health(pb.HealthRequest(), timeout=30)
        assert reply.schema_version == 1
    finally:
        stop.set()
        thread.join(90)
    assert done == [None] and events[-1] == "stopping"


def test_serve_raises_when_it_cannot_start(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        metrics_taken = CollectorSettings(data_dir=tmp_path / "a", port=0, metrics=MetricsSettings(port=port))
        with pytest.raises(SettingsError, match="--metrics-port: cannot listen on"):
            serve(metrics_taken, threading.Event())
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = CollectorSettings(data_dir=tmp_path / "b", port=holder.getsockname()[1])
        with pytest.raises(OSError, match="cannot listen on"):
            serve(busy, threading.Event())
