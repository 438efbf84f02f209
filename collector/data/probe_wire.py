"""The wire of a link probe: a listener that takes or gives a bounded number of bytes, and the
timed exchange a rank makes with it.

Plain TCP over the network a rank reaches the collector by (what gloo and NCCL's socket transport
use between hosts; not InfiniBand or NVLink). One exchange is one connection:

    client -> listener:  MAGIC, token (TOKEN_CHARS ascii), mode (b"S" send / b"R" receive), bytes (8, big-endian)
    S: client sends ``bytes``, the listener answers one DONE byte once it has them all
    R: the listener sends ``bytes`` and closes

``S`` times the client's host to the listener's (from the first byte sent to DONE: one round trip
more than the transfer), ``R`` the other way (from the header sent to the last byte). A transfer
is cut at ``timeout_s`` and measured over what it moved, so a link slowed 100x costs the job the
bound, not the whole transfer. The listener serves one connection at a time (the collector's
schedule asks one pair at a time) and takes none after its window: a probe's listener is never
left open. A connection without the right magic and token is dropped before a byte is sent.
"""

from __future__ import annotations

import hmac
import socket
import struct
import threading
import time
from dataclasses import dataclass

MAGIC = b"RSPROBE1"
TOKEN_CHARS = 32
DONE = b"K"
CHUNK = 256 << 10
MAX_BYTES = 64 << 20  # a probe moves at most this many bytes each way per pair
HEADER = struct.Struct(f">{len(MAGIC)}s{TOKEN_CHARS}sc Q")
HEADER_TIMEOUT_S = 5.0
_ZEROS = memoryview(bytes(CHUNK))


@dataclass(frozen=True)
class Timed:
    bytes: int  # moved (less than asked when cut at the bound)
    seconds: float
    complete: bool

    @property
    def mbit_s(self) -> float:
        return self.bytes * 8 / self.seconds / 1e6 if self.seconds > 0 else 0.0


class Listener:
    """Serves exchanges for ``window_s`` seconds on ``host`` (all interfaces by default), on a
    thread of its own; ``port`` is where. ``close()`` ends it early."""

    def __init__(self, token: str, *, max_bytes: int = MAX_BYTES, window_s: float = 60.0, host: str = "0.0.0.0"):
        self.token = token.encode()
        self.max_bytes = max_bytes
        self.deadline = time.monotonic() + window_s
        self.served = 0
        self._sock = socket.create_server((host, 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="rankscope-probe-listener", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def open(self) -> bool:
        return self._thread.is_alive()

    def _serve(self) -> None:
        try:
            while not self._stop.is_set() and time.monotonic() < self.deadline:
                try:
                    conn, _ = self._sock.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
                with conn:
                    try:
                        self._exchange(conn)
                        self.served += 1
                    except OSError:  # a peer gone or cut at its bound: the client measures it
                        pass
        finally:
            self._sock.close()

    def _exchange(self, conn: socket.socket) -> None:
        conn.settimeout(HEADER_TIMEOUT_S)
        magic, token, mode, nbytes = HEADER.unpack(_read_exactly(conn, HEADER.size))
        if magic != MAGIC or not hmac.compare_digest(token, self.token) or nbytes > self.max_bytes:
            return
        conn.settimeout(max(0.1, self.deadline - time.monotonic()))
        if mode == b"S":
            left, sink = nbytes, memoryview(bytearray(CHUNK))  # the bytes themselves are thrown away
            while left:
                got = conn.recv_into(sink[: min(CHUNK, left)])
                if not got:
                    return
                left -= got
            conn.sendall(DONE)
        elif mode == b"R":
            left = nbytes
            while left:
                left -= conn.send(_ZEROS[: min(CHUNK, left)])


def exchange(address: str, token: str, mode: str, nbytes: int, timeout_s: float) -> Timed:
    """Time ``nbytes`` to (mode "send") or from ("receive") the listener at ``address`` (ip:port),
    cut at ``timeout_s``. OSError when it cannot connect or the listener drops the connection."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s  # the connect counts against the bound too
    moved = 0
    with socket.create_connection((host.strip("[]"), int(port)), timeout=min(timeout_s, HEADER_TIMEOUT_S)) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        header = HEADER.pack(MAGIC, token.encode(), b"S" if mode == "send" else b"R", nbytes)
        start = time.monotonic()
        try:
            conn.sendall(header)
            if mode == "send":
                while moved < nbytes:
                    conn.settimeout(_left(deadline))
                    moved += conn.send(_ZEROS[: min(CHUNK, nbytes - moved)])
                conn.settimeout(_left(deadline))
                if conn.recv(1) != DONE:
                    raise OSError("the listener closed before confirming the bytes")
            else:
                buf = bytearray(CHUNK)
                while moved < nbytes:
                    conn.settimeout(_left(deadline))
                    got = conn.recv_into(buf)
                    if not got:
                        raise OSError(f"the listener closed after {moved} of {nbytes} bytes")
                    moved += got
        except TimeoutError:
            return Timed(moved, time.monotonic() - start, False)
    return Timed(moved, time.monotonic() - start, True)


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        got = conn.recv(n - len(buf))
        if not got:
            raise OSError("connection closed inside the header")
        buf += got
    return bytes(buf)
