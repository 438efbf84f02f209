"""A fake run through a collector: each rank's envelopes (Hello, TableBatches, RunEnd) and
``stream``, which sends them over real gRPC; and the single envelopes protocol tests build."""

from __future__ import annotations

from collector.data.codec import encode_batch, envelope_rows
from collector.testing.fake_runs.story import FakeRun, _unix_ns, uniform_run
from collector.tools.importers.sink import GrpcSink, envelope, table_batches
from proto import pb


def rank_envelopes(run: FakeRun, rank: int, steps_per_batch: int = 50) -> list[pb.Envelope]:
    """What ``rank`` sends: Hello, its rows of every table, RunEnd unless the run is still running."""
    client = run.client_id(rank)
    out = [envelope(client, 1, hello=run.hello(rank))]
    tables = [("comm", run.comm_arrow(rank, first, n)) for first, n in run.comm_chunks(steps_per_batch)]
    tables += list(run.other_tables(rank).items())
    for table, rows in tables:
        for batch in table_batches(table, run.run_id, rank, rows):  # a NULL column is a column left out
            out.append(envelope(client, len(out) + 1, table=batch))
    if run.status != "running":
        end = pb.RunEnd(run_id=run.run_id, rank=rank, status=run.status, ended_at_ns=_unix_ns(run.end))
        out.append(envelope(client, len(out) + 1, end=end))
    return out


def envelopes_of(*runs: FakeRun) -> list[list[pb.Envelope]]:
    """Every rank's envelopes of every run, one list (one client) per rank."""
    return [rank_envelopes(run, r) for run in runs for r in range(run.world_size)]


def stream(endpoint: str, *runs: FakeRun, token: str | None = None) -> None:
    """Send every rank of ``runs`` through the collector at ``endpoint``, one stream per rank;
    returns once all of it is acknowledged (durable)."""
    with GrpcSink(endpoint, token=token) as sink:
        sink.send(envelopes_of(*runs))


# ---- wire-protocol building blocks ------------------------------------------------------
def hello(client_id: str, seq: int, run_id: str, rank: int, world_size: int, **extra) -> pb.Envelope:
    return envelope(
        client_id,
        seq,
        hello=pb.Hello(
            run_id=run_id, rank=rank, world_size=world_size, run_name=extra.pop("run_name", run_id), **extra
        ),
    )


def run_end(client_id: str, seq: int, run_id: str, rank: int, status: str = "finished") -> pb.Envelope:
    return envelope(client_id, seq, end=pb.RunEnd(run_id=run_id, rank=rank, status=status, ended_at_ns=1))


def comm_columns(
    rank: int, first_seq: int, n: int, *, delay_ns: int = 0, group: str = "world", group_size: int = 4
) -> dict:
    """``rank``'s all_reduces seq first_seq .. first_seq + n - 1 of ``uniform_run``, arriving
    ``delay_ns`` after the other ranks of the group."""
    return uniform_run(group=group, group_size=group_size, late_rank=rank, delay_ns=delay_ns).comm_columns(
        rank, first_seq, n
    )


def comm_envelope(client_id: str, seq: int, run_id: str, rank: int, first_seq: int, n: int, **kw) -> pb.Envelope:
    """One TableBatch envelope of ``comm_columns(rank, first_seq, n, **kw)``."""
    return envelope(client_id, seq, table=encode_batch("comm", run_id, rank, comm_columns(rank, first_seq, n, **kw)))


# ---- straight into a Store --------------------------------------------------------------
class StoreFeed:
    """A run's ranks handing their rows straight to a collector's Store (no gRPC, no stream), each
    rank's client numbering its submissions on from ``last_seq``: for tests of what the store,
    compaction and retention make of a run that arrives piece by piece."""

    def __init__(self, store, run: FakeRun, last_seq: int = 0):
        self.store, self.run = store, run
        self.seqs = dict.fromkeys(range(run.world_size), last_seq)

    def send(self, rank: int, rows: list) -> None:
        self.seqs[rank] += 1
        self.store.submit(self.run.client_id(rank), self.seqs[rank], rows, lambda error: None)

    def hello(self, rank: int) -> None:
        self.send(rank, envelope_rows(envelope(self.run.client_id(rank), 1, hello=self.run.hello(rank))))

    def comm(self, rank: int, chunk: tuple[int, int]) -> None:
        """``rank``'s comm rows of ``chunk`` (first step, steps), one of ``run.comm_chunks``."""
        self.send(rank, [("comm", self.run.run_id, self.run.comm_arrow(rank, *chunk))])

    def end(self, rank: int) -> None:
        self.send(rank, envelope_rows(run_end(self.run.client_id(rank), 0, self.run.run_id, rank)))
