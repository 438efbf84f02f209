"""Child processes shared by the CLI, the demo, the tests and the benchmarks:
where the dashboard entry file lives, how a collector is started (its command
line, or a managed ``CollectorProcess``) and probed, torchrun's command line for
local ranks, and a free port for a child that must be told its port up front
(torchrun's master, the dashboard)."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

from proto import pb, pb_grpc


def stop_group(proc: subprocess.Popen | None, timeout_s: float = 10.0) -> None:
    """Stops a child started in its own session (torchrun and its ranks, a compiler and its jobs) as
    Ctrl-C would: SIGINT to its process group, up to ``timeout_s``, then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at this moment. Another process may take it before
    the child binds it, so servers we start ourselves bind port 0 and report theirs."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def dashboard_command(data_dir: str, *, port: int = 8501, host: str = "127.0.0.1") -> list[str]:
    """The dashboard as a process (``python -m app``, which starts Streamlit on its own entry file)."""
    if importlib.util.find_spec("app") is None:
        raise SystemExit("rankscope: the dashboard is not installed; pip install 'rankscope[dashboard]'")
    return [sys.executable, "-m", "app", "--data-dir", os.path.abspath(data_dir), "--port", str(port), "--host", host]


def torchrun_command(nproc: int, *args: str) -> list[str]:
    """``python -m torch.distributed.run`` with ``nproc`` local ranks and a free rendezvous
    port on this host, then ``args`` (``-m module ...`` or a script and its arguments)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        *args,
    ]


def collector_command(data_dir: str, *, port: int, host: str = "127.0.0.1") -> list[str]:
    return [
        sys.executable,
        "-m",
        "collector.tools.cli",
        "collect",
        "--data-dir",
        data_dir,
        "--host",
        host,
        "--port",
        str(port),
    ]


class CollectorProcess:
    """``rankscope collect`` in a child process (a GIL of its own), started and waited for.

    ``port`` 0 lets the collector pick one; ``args`` are more ``collect`` options
    (``--flush-interval 0.02``, ``--writer-id east``, ``--token ...``); ``tree`` runs the
    collector from another source tree (a benchmark's baseline: another commit, exported).
    It profiles no rank unless ``auto_profile`` (``collect --no-auto-profile``; a ``tree`` keeps its
    own default, an older commit may not know the flag): a capture changes the profiled ranks' steps,
    which the tests and benchmarks that start it measure. ``preexec_fn`` runs in the child before
    the collector starts (the demo's ``os.setpgrp``). With ``--metrics-port 0`` among ``args`` the
    collector picks the port, ``metrics_port`` says which (a port chosen beforehand may be taken by
    then). Raises RuntimeError with the collector's stderr if it exits before listening."""

    _LISTENING = re.compile(r"rankscope collector listening on \S+:(\d+) ")
    _METRICS = re.compile(r"rankscope collector: Prometheus metrics on http://\S+:(\d+)/metrics")
    _COMPACTED = re.compile(r"rankscope collector: compaction pass done \((\d+) merges\)")

    def __init__(
        self,
        data_dir,
        *args: str,
        port: int = 0,
        tree: Path | None = None,
        auto_profile: bool = False,
        preexec_fn=None,
    ) -> None:
        self._stderr = tempfile.TemporaryFile(mode="w+")
        env = None
        if tree is not None:  # `python -m` puts the working directory first on the path: run from there
            env = {**os.environ, "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen(
            collector_command(str(Path(data_dir).resolve()), port=port)
            + ([] if auto_profile or tree is not None else ["--no-auto-profile"])
            + list(args),
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            cwd=tree,
            env=env,
            preexec_fn=preexec_fn,
        )
        line = self.proc.stdout.readline()
        match = self._LISTENING.match(line)
        if not match:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"collector did not start (exit {self.proc.returncode}): {line!r} {self.stderr()}")
        self.port = int(match.group(1))
        self.address = f"127.0.0.1:{self.port}"
        self.metrics_port = None
        if "--metrics-port" in args:  # its line follows the listening line at once
            metrics = self._METRICS.match(self.proc.stdout.readline())
            self.metrics_port = int(metrics.group(1)) if metrics else None
        self._stdout: list[str] = []
        self._said = threading.Condition()
        threading.Thread(target=self._read_stdout, name="collector-stdout", daemon=True).start()

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-4000:]

    def compact_now(self, timeout_s: float = 120) -> int:
        """SIGUSR1: one compaction pass (rollups, merges, retention) now, on the collector's main
        thread; returns its merges once the collector says it is done. Raises TimeoutError naming
        the wait and the host's load if it does not say so within ``timeout_s``."""
        with self._said:
            done_before = sum(1 for line in self._stdout if self._COMPACTED.match(line))
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout_s
        with self._said:
            while (left := deadline - time.monotonic()) > 0:
                done = [m for line in self._stdout if (m := self._COMPACTED.match(line))]
                if len(done) > done_before:
                    return int(done[done_before].group(1))
                if self.proc.poll() is not None:
                    raise RuntimeError(f"collector exited ({self.proc.returncode}) before its pass: {self.stderr()}")
                self._said.wait(min(left, 1.0))
        raise TimeoutError(
            f"no compaction pass done within {timeout_s:.0f} s of SIGUSR1 (load {os.getloadavg()[0]:.1f} "
            f"on {os.cpu_count()} cores): {self.stderr()}"
        )

    def stdout(self) -> str:
        """What the collector printed after its listening line (read as it comes: a collector that
        prints a lot never blocks on a full pipe)."""
        with self._said:
            return "".join(self._stdout)

    def _read_stdout(self) -> None:
        for line in self.proc.stdout:
            with self._said:
                self._stdout.append(line)
                self._said.notify_all()

    def stop(self, timeout_s: float = 60) -> int:
        """SIGTERM: the collector commits what it buffered, then exits."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL: a crash, nothing committed on the way out."""
        self.proc.kill()
        self.proc.wait(30)

    def __enter__(self) -> CollectorProcess:
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.stop()
        self._stderr.close()


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
