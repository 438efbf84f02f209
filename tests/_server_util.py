"""Helpers for the collector tests: a raw stub-level client built from the proto
and collector.data.codec, and generators of envelopes with known contents."""
from __future__ import annotations

import queue
import threading
from collections.abc import Iterable

import grpc
import numpy as np

from collector.data.codec import encode_batch
from proto import SCHEMA_VERSION, pb, pb_grpc


def hello(client_id: str, seq: int, run_id: str, rank: int, world_size: int, **extra) -> pb.Envelope:
    return pb.Envelope(schema_version=SCHEMA_VERSION, client_id=client_id, seq=seq,
                       hello=pb.Hello(run_id=run_id, rank=rank, world_size=world_size,
                                      run_name=extra.pop("run_name", run_id), **extra))


def run_end(client_id: str, seq: int, run_id: str, rank: int, status: str = "finished") -> pb.Envelope:
    return pb.Envelope(schema_version=SCHEMA_VERSION, client_id=client_id, seq=seq,
                       end=pb.RunEnd(run_id=run_id, rank=rank, status=status, ended_at_ns=1))


def comm_columns(rank: int, first_seq: int, n: int, *, delay_ns: int = 0, group: str = "world",
                 group_size: int = 4) -> dict:
    """n all_reduce records of one rank; instance k starts at k*1000 ns (+ delay_ns)."""
    seqs = np.arange(first_seq, first_seq + n, dtype=np.int64)
    start = seqs * 1000 + delay_ns
    return {
        "step": seqs // 10, "group_name": [group] * n, "group_size": np.full(n, group_size),
        "seq": seqs, "op": ["all_reduce"] * n, "log_name": ["grads"] * n, "dtype": ["float32"] * n,
        "numel": np.full(n, 256), "bytes": np.full(n, 1024), "start_ns": start, "end_ns": start + 500,
        "async_op": np.zeros(n, dtype=bool), "algbw_gbs": np.full(n, 1.5), "busbw_gbs": np.full(n, 2.25),
        "peer": np.full(n, -1),
    }


def comm_envelope(client_id: str, seq: int, run_id: str, rank: int, first_seq: int, n: int,
                  **kw) -> pb.Envelope:
    batch = encode_batch("comm", run_id, rank, comm_columns(rank, first_seq, n, **kw))
    return pb.Envelope(schema_version=SCHEMA_VERSION, client_id=client_id, seq=seq, table=batch)


class RawStream:
    """One bidi Stream driven by hand: send envelopes, collect acked seqs."""

    def __init__(self, channel: grpc.Channel, metadata=None, on_ack=None):
        self._on_ack = on_ack  # called with each Ack's seqs, before they count as acked
        self._outbox: queue.Queue = queue.Queue()
        self.acked: set[int] = set()
        self._cond = threading.Condition()
        self.error: grpc.RpcError | None = None
        self.done = threading.Event()
        stub = pb_grpc.CollectorStub(channel)
        self._call = stub.Stream(iter(self._outbox.get, None), metadata=metadata)
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()

    def _collect(self):
        try:
            for ack in self._call:
                if self._on_ack is not None:
                    self._on_ack(list(ack.seqs))
                with self._cond:
                    self.acked.update(ack.seqs)
                    self._cond.notify_all()
        except grpc.RpcError as exc:
            self.error = exc
        finally:
            self.done.set()
            with self._cond:
                self._cond.notify_all()

    def send(self, *envelopes: pb.Envelope) -> None:
        for env in envelopes:
            self._outbox.put(env)

    def close(self) -> None:
        """Half-close: the server acks what is outstanding, then ends the stream."""
        self._outbox.put(None)

    def wait_acked(self, seqs: Iterable[int], timeout: float = 30.0) -> bool:
        want = set(seqs)
        with self._cond:
            return self._cond.wait_for(lambda: want <= self.acked or self.done.is_set(), timeout) \
                and want <= self.acked

    def finish(self, timeout: float = 30.0) -> None:
        self.close()
        assert self.done.wait(timeout), "stream did not end"

    def cancel(self) -> None:
        self._call.cancel()
        self._outbox.put(None)


def stored_rows(data_dir, table: str = "comm") -> int:
    """Rows in the committed segments of ``table``, read with pyarrow (not the catalog)."""
    import pyarrow.parquet as pq
    from pathlib import Path
    return sum(pq.ParquetFile(p).metadata.num_rows
               for p in (Path(data_dir) / "parquet" / table).glob("run=*/*.parquet"))
