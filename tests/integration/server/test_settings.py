"""The collector's settings object (collector.server.settings) and serve(): a bad setting is refused
by name before anything is created; serve runs a real collector until told to stop, tells its
caller where it listens, and raises (never prints, never returns an exit code) when it cannot start.

Split by tier: the pure-function tests are in tests/unit/server/test_settings.py."""

import socket
import threading

import grpc
import pytest

from collector.server.serve import serve
from collector.server.settings import CollectorSettings, MetricsSettings, SettingsError
from proto import pb, pb_grpc


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
