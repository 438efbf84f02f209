"""What keeps tests/unit pure: while a unit test runs, opening a network socket, starting a process
(subprocess, multiprocessing, fork, so a browser or torchrun too) or a torch.distributed process
group is refused, and the test fails even if the code under test swallowed the refusal.

Such a test belongs in tests/integration. The check patches the Python entry points; a C extension
that opens its own sockets (gRPC's core) is caught where the Python code asks for it (grpc.server,
grpc.*_channel)."""

from __future__ import annotations

import multiprocessing.process
import os
import socket
import subprocess
import sys
from contextlib import contextmanager

_INET = (socket.AF_INET, socket.AF_INET6)


class ImpureTest(Exception):
    """A unit test did something only an integration test may do."""


@contextmanager
def pure():
    """Refuses sockets, processes and process groups inside the block; raises ImpureTest on the way
    out if anything was attempted, caught or not."""
    attempts: list[str] = []
    undo: list[tuple[object, str, object]] = []

    def refuse(owner: object, name: str, what: str) -> None:
        original = getattr(owner, name)

        def refused(*args, **kwargs):
            attempts.append(what)
            raise ImpureTest(f"a unit test {what}: move it to tests/integration")

        undo.append((owner, name, original))
        setattr(owner, name, refused)

    def refuse_inet(owner: type) -> None:
        original = owner.__init__

        def checked(self, family=-1, type=-1, proto=-1, fileno=None):
            if fileno is None and (family == -1 or family in _INET):
                attempts.append("opened a network socket")
                raise ImpureTest("a unit test opened a network socket: move it to tests/integration")
            original(self, family, type, proto, fileno)

        undo.append((owner, "__init__", original))
        owner.__init__ = checked

    refuse_inet(socket.socket)
    for name in ("connect", "connect_ex", "bind"):
        refuse(socket.socket, name, f"called socket.{name}")
    refuse(subprocess.Popen, "__init__", "started a subprocess")
    refuse(multiprocessing.process.BaseProcess, "start", "started a multiprocessing process")
    for name in ("fork", "forkpty", "system", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            refuse(os, name, f"called os.{name}")
    grpc = sys.modules.get("grpc")
    if grpc is not None:
        for name in ("server", "insecure_channel", "secure_channel"):
            refuse(grpc, name, f"called grpc.{name}")
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        for name in ("init_process_group", "TCPStore"):
            if hasattr(dist, name):
                refuse(dist, name, f"called torch.distributed.{name}")
    try:
        yield attempts
    finally:
        for owner, name, original in reversed(undo):
            setattr(owner, name, original)
        if dist is not None and dist.is_available() and dist.is_initialized():
            attempts.append("left a torch.distributed process group initialised")
    if attempts:
        raise ImpureTest(f"a unit test {'; '.join(dict.fromkeys(attempts))}: move it to tests/integration")
