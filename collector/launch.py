"""Child-process command lines shared by the CLI and the demo: where the
dashboard entry file lives and how the collector is started and probed."""
from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import grpc

from proto import pb, pb_grpc


def dashboard_entry() -> str:
    spec = importlib.util.find_spec("app")  # a path lookup, not an import of the app
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("rankscope: the dashboard package `app` is not installed")
    return str(Path(list(spec.submodule_search_locations)[0]) / "main.py")


def dashboard_command(data_dir: str, *, port: int = 8501, host: str = "127.0.0.1") -> list[str]:
    return [
        sys.executable, "-m", "streamlit", "run", dashboard_entry(),
        "--server.port", str(port), "--server.address", host, "--server.headless", "true",
        "--browser.gatherUsageStats", "false",
        "--", "--data-dir", os.path.abspath(data_dir),
    ]


def collector_command(data_dir: str, *, port: int, host: str = "127.0.0.1") -> list[str]:
    return [sys.executable, "-m", "collector.cli", "collect", "--data-dir", data_dir,
            "--host", host, "--port", str(port)]


def wait_for_collector(endpoint: str, timeout_s: float = 30.0) -> pb.HealthReply:
    """Poll the Health RPC until the collector answers; raise TimeoutError naming the endpoint."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    with grpc.insecure_channel(endpoint) as channel:
        stub = pb_grpc.CollectorStub(channel)
        while time.monotonic() < deadline:
            try:
                return stub.Health(pb.HealthRequest(), timeout=1.0)
            except grpc.RpcError as exc:
                last = exc
                time.sleep(0.2)
    raise TimeoutError(f"collector at {endpoint} did not answer within {timeout_s:.0f}s ({last})")
