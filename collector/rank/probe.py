"""What a rank does for a link probe (collector.server.probe): listen, or time its links to peers.

Two requests ride the collector's acks like the other commands (collector.rank.capture):

* ``probe_listen``: open a listener (collector.data.probe_wire) on every interface, on a free port,
  for ``timeout_s`` seconds, accepting only the request's token; answered with a ``listening`` row
  of the ``probes`` table carrying the port (the collector knows the rank's address: its stream's).
  A new probe closes the last one's listener.
* ``probe``: for each of ``peers`` in order, send ``bytes`` to it and take ``bytes`` from it, each
  cut at ``timeout_s``; one ``measured`` row each way, or a ``failed`` row saying why.

Nothing runs on the training thread: the exchanges run on a thread of their own, started at the
next step boundary (waiting at most BOUNDARY_WAIT_S for one), so a probe shares the link with the
step's traffic as it is, the way the slowdown it is asked about does. What a probe costs the job is
the bytes it adds to the link (at most ``bytes`` each way per peer) for the seconds it takes.
"""

from __future__ import annotations

import logging
import threading
import time

from collector.data import probe_wire
from collector.rank import session, state

log = logging.getLogger("rankscope.probe")

KINDS = ("probe_listen", "probe")
MAX_LISTEN_S = 600.0
MAX_TIMEOUT_S = 30.0
BOUNDARY_WAIT_S = 2.0


def _rows(request, status: str, **fields) -> None:
    s = session.active()
    if s is None:
        return
    row = {"request_id": request.id, "status": status, "host": s.host, "time_ns": time.time_ns(), "step": state.step}
    session.emit_rows("probes", [{**row, **fields}])
    s.client.poke()  # the collector waits for the answer to schedule the next pair


class Probe:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.listener: probe_wire.Listener | None = None
        self.running: threading.Thread | None = None

    def handle(self, request) -> None:
        """From the ack reader thread: answer or start at once; never blocks, never raises."""
        try:
            if request.kind == "probe_listen":
                self._listen(request)
            else:
                self._start(request)
        except Exception as exc:
            log.exception("rankscope: a link probe request failed")
            _rows(request, "failed", detail=f"{exc!r}")

    def _listen(self, request) -> None:
        if len(request.token) != probe_wire.TOKEN_CHARS:
            _rows(request, "refused", detail=f"the token is not {probe_wire.TOKEN_CHARS} characters")
            return
        window = min(max(request.timeout_s, 1.0), MAX_LISTEN_S)
        with self._lock:
            if self.listener is not None:
                self.listener.close()
            self.listener = probe_wire.Listener(request.token, max_bytes=probe_wire.MAX_BYTES, window_s=window)
            port = self.listener.port
        _rows(request, "listening", port=port, detail=f"for {window:.0f} s")

    def _start(self, request) -> None:
        nbytes, timeout = int(request.bytes), float(request.timeout_s)
        if not 0 < nbytes <= probe_wire.MAX_BYTES or not 0 < timeout <= MAX_TIMEOUT_S or not request.peers:
            _rows(request, "refused", detail=f"bytes {nbytes}, timeout {timeout} s or peers out of bounds")
            return
        with self._lock:
            if self.running is not None and self.running.is_alive():
                _rows(request, "refused", detail="a probe is already running")
                return
            self.running = threading.Thread(target=self._run, args=(request,), name="rankscope-probe", daemon=True)
            self.running.start()

    def _run(self, request) -> None:
        first = state.step
        deadline = time.monotonic() + BOUNDARY_WAIT_S
        while state.step == first and time.monotonic() < deadline:  # the next step boundary
            time.sleep(0.005)
        nbytes, timeout = int(request.bytes), request.timeout_s
        for peer in request.peers:
            where = {"peer_rank": peer.rank, "peer_host": peer.host}
            for direction in ("send", "receive"):
                try:
                    t = probe_wire.exchange(peer.address, request.token, direction, nbytes, timeout)
                except OSError as exc:
                    _rows(request, "failed", direction=direction, detail=f"{peer.address}: {exc}", **where)
                    break
                _rows(
                    request,
                    "measured",
                    direction=direction,
                    bytes=t.bytes,
                    seconds=t.seconds,
                    mbit_s=t.mbit_s,
                    detail="" if t.complete else f"cut at {request.timeout_s:g} s",
                    **where,
                )

    def close(self) -> None:
        with self._lock:
            if self.listener is not None:
                self.listener.close()
                self.listener = None


PROBE = Probe()
