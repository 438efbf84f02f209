"""What a running collector holds: its store, compactor, liveness and commands, the findings it
holds per run (collector.server.live_findings), the stream limits, the counters ``Health``
reports, and who each client is (its Hello), for streams that send none (collector.server.service)."""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path

from collector.data import catalog
from collector.server.commands import Commands
from collector.server.compaction import CompactionConfig, Compactor
from collector.server.limits import PeerStreams, StreamLimits
from collector.server.live_findings import LiveFindings
from collector.server.liveness import Liveness
from collector.server.probe import Prober
from collector.server.resends import Resends
from collector.server.store import Store, StoreConfig
from collector.server.write_status import WriteStatus
from proto import pb

CLIENT_IDENTITIES = 1 << 18  # client_id -> (run, rank) of its Hello, newest kept (~100 bytes each)


class CollectorState:
    """The store, the compactor, the stream limits and the counters Health reports."""

    def __init__(
        self,
        data_dir,
        store_config: StoreConfig | None = None,
        compaction_config: CompactionConfig | None = None,
        writer: str | None = None,
        stream_limits: StreamLimits | None = None,
    ):
        self.data_dir = Path(data_dir).resolve()
        self.limits = stream_limits or StreamLimits()
        self.peers = PeerStreams(self.limits.max_streams_per_peer)
        self.store = Store(self.data_dir, store_config, writer)  # recovers the data dir first
        self.store.write_status = WriteStatus(self.data_dir)  # a failing disk, said in the log, /metrics, health
        catalog.ensure_catalog(self.data_dir)
        self.compactor = Compactor(self.data_dir, self.store.ledger, compaction_config).start()
        self.liveness = Liveness(self.store)
        self.commands = Commands(self.liveness)
        self.findings = LiveFindings(self.liveness)
        self.prober = Prober(self.liveness, self.findings)
        self.resends = Resends(self.data_dir)
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self.open_streams = 0
        self.batches_rejected = 0
        self._identities: collections.OrderedDict[str, tuple[str, int]] = collections.OrderedDict()
        self._world_sizes: collections.OrderedDict[str, int] = collections.OrderedDict()

    def said_hello(self, client_id: str, hello: pb.Hello) -> None:
        """Remember who a client is (its Hello), for its streams that send none."""
        with self._lock:
            for known, key, value in (
                (self._identities, client_id, (hello.run_id, hello.rank)),
                (self._world_sizes, hello.run_id, hello.world_size),
            ):
                known[key] = value
                known.move_to_end(key)
                if len(known) > CLIENT_IDENTITIES:
                    known.popitem(last=False)

    def identity_of(self, client_id: str) -> tuple[str, int] | None:
        with self._lock:
            return self._identities.get(client_id)

    def world_size_of(self, run_id: str) -> int | None:
        with self._lock:
            return self._world_sizes.get(run_id)

    def count(self, streams: int = 0, rejected: int = 0) -> None:
        with self._lock:
            self.open_streams += streams
            self.batches_rejected += rejected

    def close(self) -> None:
        self.liveness.stop()
        self.compactor.stop()
        self.store.close()
        self.resends.close()
