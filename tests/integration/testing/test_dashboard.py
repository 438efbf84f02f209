"""collector.testing.dashboard: the dashboard process answers once started and is gone
once stopped; one that cannot start says why instead of hanging."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from collector.testing.dashboard import DashboardProcess
from collector.testing.fake_runs import LIVE, write_data_dir


def test_started_it_serves_the_data_dir_and_stopped_it_is_gone(tmp_path):
    data = write_data_dir(tmp_path / "data", LIVE)
    with DashboardProcess(data) as dashboard:
        with urllib.request.urlopen(f"{dashboard.url}/_stcore/health", timeout=10) as reply:
            assert reply.status == 200
        assert dashboard.proc.poll() is None
    assert dashboard.proc.poll() is not None
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{dashboard.url}/_stcore/health", timeout=2)


def test_a_dashboard_that_cannot_listen_is_an_error_with_its_output(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"exited with .* before answering on port {port}: .*"):
            DashboardProcess(tmp_path, port=port, timeout_s=60)
