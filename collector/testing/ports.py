"""Free loopback ports, whether a local HTTP endpoint answers yet, and stopping the child
server behind it. The free-port
definition lives with the process launchers in ``collector.tools.launch`` (the demo
needs it too); tests and benchmarks take it from here with the rest of their plumbing."""

import subprocess
import urllib.request
from typing import IO, Self

from collector.tools.launch import free_port

__all__ = ["ChildServer", "answers_ok", "free_port", "terminate"]


def answers_ok(url: str) -> bool:
    """Whether ``url`` answers HTTP 200 within a second (a child server's readiness probe)."""
    try:
        with urllib.request.urlopen(url, timeout=1) as reply:
            return reply.status == 200
    except OSError:
        return False


def terminate(proc: subprocess.Popen, timeout: float = 20) -> None:
    """SIGTERM, and SIGKILL if ``proc`` has not exited within ``timeout`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class ChildServer:
    """A server started as a child process (``proc``) whose output goes to ``_log``: ``stop``
    ends both, and a ``with`` block stops it on the way out."""

    proc: subprocess.Popen
    _log: IO[bytes]

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM, and SIGKILL if it has not exited within ``timeout`` seconds."""
        terminate(self.proc, timeout)
        self._log.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
