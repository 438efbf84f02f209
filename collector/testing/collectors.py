"""A real collector for a test or a benchmark, in this process: gRPC on a port the OS
picks, the real store writing Parquet segments and the catalog under ``data_dir``.

    with live_collector(tmp_path / "data") as collector:
        endpoint, data_dir = collector            # unpacks like a pair
        channel = collector.channel()             # closed when the block ends
        ...                                       # collector.state: the store, ledger, compaction
        collector.compact_until(lambda: ..., "the rollup")  # passes now, not when the thread wakes

The store flushes every 50 ms (``FAST_STORE``) so what a test sends is durable and
visible almost at once. Compaction is off unless a test passes a ``compaction_config``:
a merge unlinks the segments it merged, and a test reading the catalog while the
collector runs would then fail now and then to open one it had just listed (the
dashboard and the tools retry such reads, ``catalog.with_segment_retry``; a test's
ad-hoc query does not). Leaving the block stops the server (waiting ``grace_s`` for
streams still open) and closes the store, which commits what it buffered.

A collector in its own process (its own GIL, killable with SIGKILL) is
``collector.tools.launch.CollectorProcess``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from collector.data import security
from collector.server.compaction import CompactionConfig
from collector.server.limits import StreamLimits
from collector.server.service import CollectorState, create_server
from collector.server.store import StoreConfig

FAST_STORE = StoreConfig(flush_interval=0.05)
NO_COMPACTION = CompactionConfig(interval=3600)  # never within a test


@dataclass
class LiveCollector:
    endpoint: str  # "127.0.0.1:<port>"
    port: int
    data_dir: Path
    state: CollectorState  # the running store, ledger and compactor
    _channels: list[grpc.Channel] = field(default_factory=list, repr=False)

    def __iter__(self) -> Iterator:
        """``endpoint, data_dir = collector``."""
        return iter((self.endpoint, self.data_dir))

    def compact_until(self, done: Callable[[], bool], what: str, timeout_s: float = 300) -> int:
        """Compaction passes (rollups, retention, merges) on the calling thread, one after another,
        until ``done()``; returns how many it took. The collector's own compactor thread runs at
        nice +10 and, on a loaded host, late: a test that needs a pass to have happened asks for
        it. Raises AssertionError naming ``what`` did not happen, and the host's load, after
        ``timeout_s``."""
        deadline, passes = time.monotonic() + timeout_s, 0
        while not done():
            if time.monotonic() > deadline:
                load = f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
                raise AssertionError(f"{what} did not happen in {passes} compaction passes, {timeout_s:.0f} s ({load})")
            self.state.compactor.run_pass()
            passes += 1
        return passes

    def channel(self, options: list[tuple[str, object]] | None = None) -> grpc.Channel:
        """A plaintext channel to this collector, closed when it stops."""
        channel = grpc.insecure_channel(self.endpoint, options=options or [])
        self._channels.append(channel)
        return channel


@contextlib.contextmanager
def live_collector(
    data_dir,
    *,
    port: int = 0,
    token: str | None = None,
    tls: security.ServerTLS | None = None,
    store_config: StoreConfig = FAST_STORE,
    compaction_config: CompactionConfig = NO_COMPACTION,
    writer: str | None = None,
    stream_limits: StreamLimits | None = None,
    grace_s: float = 2.0,
) -> Iterator[LiveCollector]:
    """A started collector on 127.0.0.1 over ``data_dir`` (created if missing); with ``token``
    it requires that bearer token, with ``tls`` it speaks TLS only."""
    data_dir = Path(data_dir)
    server, bound, state = create_server(
        f"127.0.0.1:{port}",
        data_dir,
        token,
        tls=tls,
        store_config=store_config,
        compaction_config=compaction_config,
        stream_limits=stream_limits,
        writer=writer,
    )
    server.start()
    collector = LiveCollector(f"127.0.0.1:{bound}", bound, data_dir, state)
    try:
        yield collector
    finally:
        for channel in collector._channels:
            channel.close()
        server.stop(grace=grace_s).wait()
        state.close()


def stored_rows(data_dir, table: str = "comm") -> int:
    """Rows in the committed segments of ``table``, read with pyarrow rather than through
    the catalog, so a test of the catalog does not vouch for itself."""
    import pyarrow.parquet as pq

    segments = (Path(data_dir) / "parquet" / table).glob("run=*/*.parquet")
    return sum(pq.ParquetFile(p).metadata.num_rows for p in segments)
