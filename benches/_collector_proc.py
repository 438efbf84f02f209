"""A collector in its own process for the benchmarks (so it has a GIL of its own)."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

_SCRIPT = """
import signal, sys, threading
from collector.server import create_server
server, port, state = create_server("127.0.0.1:0", sys.argv[1])
server.start()
print(f"listening {port}", flush=True)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
stop.wait()
server.stop(5).wait()
state.close()
"""


class CollectorProcess:
    def __init__(self, data_dir: Path):
        self.proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, str(data_dir)],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        match = re.match(r"listening (\d+)", line)
        if not match:
            self.proc.kill()
            raise RuntimeError(f"collector did not start: {line!r}")
        self.port = int(match.group(1))
        self.address = f"127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        """User + system CPU the collector process has used so far."""
        import psutil
        times = psutil.Process(self.proc.pid).cpu_times()
        return times.user + times.system

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)

    def __enter__(self) -> "CollectorProcess":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.stop()
