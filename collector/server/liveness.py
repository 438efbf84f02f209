"""The collector's live view of every rank: who is stuck, who is missing, who went away.

Fed by what the streams deliver (``observe`` for each accepted envelope, ``closed``
when a stream ends), it keeps per run, in memory:

* each rank's stream (to send it requests), its last heartbeat and period;
* the collectives each rank reports in flight (collector.rank.watchdog's ``inflight``
  rows), with their group's members.

A checker thread looks every ``CHECK_INTERVAL_S``:

* a collective hung by collector.data.hang_rule (some rank has waited in it for the smallest
  ``hang_after_s`` of the ranks waiting in it): every member that is not waiting in it (missing)
  is asked for its Python stacks, once per collective;
* a rank without a heartbeat for ``SILENT_AFTER_PERIODS`` periods is asked once per
  silence;
* a rank asked that sends no ``stacks`` rows within ``answer_within_s`` (process
  stopped, GIL held in native code) gets a ``rank_events`` row ``unresponsive``.

A run is forgotten once nothing about it can happen any more without new data: none of its ranks
has a stream open here, a request unanswered, a silence not yet asked about or (not ended) a
collective in flight. Its next envelope brings it back. So the checker walks the runs that are
live, not every run the collector has seen (10,000 finished runs cost it nothing).

A stream that ends without the rank's RunEnd gets a ``rank_events`` row
``disconnected`` (the process is gone, or its connection is). These rows go through
the store like any envelope (under this collector's own client id), so the catalog's
``rank_liveness`` view and ``rankscope health`` see them.

The service talks to this module through three calls, ``observe(stream, env)``,
``closed(stream)`` and ``stop()``, and gives it a ``stream`` object with
``request(pb.RankRequest)``; nothing here knows about gRPC threads, so a port of the
service to grpc.aio keeps this module as is.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa

from collector.data import hang_rule
from collector.data.codec import decode_batch
from collector.data.schema import RANK_EVENTS_SCHEMA, timestamp
from proto import pb

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 0.25
SILENT_AFTER_PERIODS = 3
ANSWER_WITHIN_S = 5.0


def _crossed(entered_ns: int | None, time_ns: int | None, hang_after_s: float | None) -> bool:
    """Whether an in-flight report says its rank had waited past its own setting (hang_rule)."""
    waited_s = ((time_ns or 0) - (entered_ns or 0)) / 1e9
    return hang_rule.is_hung(waited_s, hang_rule.threshold([hang_after_s]))


class RankStream(Protocol):
    def request(self, request: pb.RankRequest) -> None: ...


def members(label: str, size: int) -> list[int]:
    """'0-3,8' -> [0, 1, 2, 3, 8] (the recorder's group label); '' -> range(size)."""
    if not label:
        return list(range(size))
    out: list[int] = []
    for part in label.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


@dataclass
class _Rank:
    stream: RankStream | None = None
    host: str = ""
    ended: bool = False
    last_beat_ns: int = 0  # the rank's clock (wall ns), as its heartbeats say
    last_seen: float = 0.0  # our monotonic clock, when its last heartbeat arrived
    period_s: float = 1.0
    step: int = 0
    inflight: dict = field(default_factory=dict)  # (group, seq) -> (entered_ns, time_ns, hang_after_s, members, op)
    asked_at: float | None = None  # our monotonic clock, when we last asked for stacks
    answered: bool = True
    silent_asked: bool = False


class Liveness:
    def __init__(self, store, *, answer_within_s: float = ANSWER_WITHIN_S, start: bool = True) -> None:
        self.store = store
        self.answer_within_s = answer_within_s
        self.runs: dict[str, dict[int, _Rank]] = {}
        self._asked_for: set[tuple] = set()  # (run_id, group, seq, rank): each missing rank asked once per hang
        self._lock = threading.Lock()
        self._client_id = f"rankscope-collector.{secrets.token_hex(6)}"
        self._seq = itertools.count(1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rankscope-liveness", daemon=True)
        if start:
            self._thread.start()

    # ---- fed by the service ----
    def observe(self, stream: RankStream, env: pb.Envelope) -> None:
        """An accepted envelope; never raises (the live view must not cost a stream)."""
        try:
            body = env.WhichOneof("body")
            if body == "hello":
                with self._lock:
                    rank = self._rank(env.hello.run_id, env.hello.rank)
                    rank.stream, rank.ended, rank.host = stream, False, env.hello.host
                    rank.last_seen = rank.last_seen or time.monotonic()
            elif body == "end":
                with self._lock:
                    self._rank(env.end.run_id, env.end.rank).ended = True
            elif body == "table" and env.table.table in ("heartbeats", "inflight", "stacks"):
                self._table(stream, env.table)
        except Exception:
            log.exception("liveness: could not read envelope seq %d", env.seq)

    def closed(self, stream: RankStream) -> None:
        """A stream ended: ranks it carried that did not end the run are gone."""
        gone = []
        with self._lock:
            for run_id, ranks in self.runs.items():
                for r, rank in ranks.items():
                    if rank.stream is stream:
                        rank.stream = None
                        if not rank.ended:
                            gone.append((run_id, r))
        for run_id, r in gone:
            self._event(run_id, r, "disconnected", "the stream closed without RunEnd")

    def streaming_runs(self) -> set[str]:
        """The runs with a rank whose stream is open here now."""
        with self._lock:
            return {run_id for run_id, ranks in self.runs.items() if any(r.stream is not None for r in ranks.values())}

    def streams_of(self, run_id: str) -> dict[int, tuple[RankStream, str]]:
        """rank -> (its open stream, its host), for the ranks of ``run_id`` streaming here and not ended
        (what a command can reach: collector.server.commands)."""
        with self._lock:
            ranks = self.runs.get(run_id, {}).items()
            return {r: (rank.stream, rank.host) for r, rank in ranks if rank.stream is not None and not rank.ended}

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)

    def _rank(self, run_id: str, rank: int) -> _Rank:
        return self.runs.setdefault(run_id, {}).setdefault(rank, _Rank())

    def _table(self, stream: RankStream, batch: pb.TableBatch) -> None:
        rows = decode_batch(batch).to_pylist()
        now = time.monotonic()
        news = False  # a row someone polling `rankscope health` is waiting for
        with self._lock:
            rank = self._rank(batch.run_id, batch.rank)
            if rank.stream is None:
                rank.stream = stream
            if batch.table == "heartbeats":
                for row in rows:
                    if (row["time_ns"] or 0) >= rank.last_beat_ns:
                        rank.last_beat_ns, rank.step = row["time_ns"] or 0, row["step"] or 0
                        rank.period_s = row["period_s"] or 1.0
                rank.last_seen, rank.silent_asked = now, False
                # a collective not reported since the previous beat has left flight
                horizon = rank.last_beat_ns - int(1.5e9 * rank.period_s)
                rank.inflight = {k: v for k, v in rank.inflight.items() if v[1] >= horizon}
            elif batch.table == "inflight":
                for row in rows:
                    key = (row["group_name"], row["seq"])
                    if row["state"] == "failed":
                        rank.inflight.pop(key, None)
                        news = True  # a collective that raised: a desync or a peer gone
                        continue
                    # news once per collective: the report that first says it crossed the rank's setting
                    news = news or (_crossed(row["entered_ns"], row["time_ns"], row["hang_after_s"])
                                    and not _crossed(*rank.inflight.get(key, (0, 0, None))[:3]))  # fmt: skip
                    rank.inflight[key] = (
                        row["entered_ns"],
                        row["time_ns"],
                        row["hang_after_s"],
                        members(row["group_ranks"] or "", row["group_size"] or 0),
                        row["op"],
                    )
            else:  # stacks: an answer (or a capture of its own, which answers as well)
                rank.answered = True
        if news:  # readable now, not at the store's next interval (the envelope is submitted already)
            self._readable_now()

    # ---- the checker ----
    def _run(self) -> None:
        while not self._stop.wait(CHECK_INTERVAL_S):
            try:
                self.check()
            except Exception:
                log.exception("liveness: check failed")

    def check(self, now_ns: int | None = None) -> None:
        """Ask missing and silent ranks for stacks; report those that do not answer."""
        now_ns = now_ns or time.time_ns()
        now = time.monotonic()
        asks: list[tuple[_Rank, str]] = []
        unresponsive: list[tuple[str, int, str]] = []
        with self._lock:
            for run_id, ranks in self.runs.items():
                for key, (op, waiting, threshold_s, group_members, oldest_ns) in self._stuck(ranks).items():
                    if not hang_rule.is_hung((now_ns - oldest_ns) / 1e9, threshold_s):
                        continue
                    group, seq = key
                    for m in group_members:
                        if m in waiting or (run_id, group, seq, m) in self._asked_for:
                            continue
                        self._asked_for.add((run_id, group, seq, m))
                        rank = ranks.get(m)
                        if rank is not None and not rank.ended:
                            asks.append((rank, f"missing from {op} #{seq} of {group}"))
                for r, rank in ranks.items():
                    silent = now - rank.last_seen > SILENT_AFTER_PERIODS * rank.period_s
                    if silent and rank.last_beat_ns and not rank.ended and not rank.silent_asked:
                        rank.silent_asked = True
                        asks.append((rank, f"silent for {now - rank.last_seen:.0f} s"))
                    if not rank.answered and rank.asked_at is not None and now - rank.asked_at > self.answer_within_s:
                        rank.answered = True  # reported once per request
                        unresponsive.append((run_id, r, f"no stacks within {self.answer_within_s:g} s of asking"))
            for rank, _ in asks:
                rank.asked_at, rank.answered = now, False
            self._forget_quiet_runs()
        for rank, reason in asks:
            if rank.stream is not None:
                try:
                    rank.stream.request(pb.RankRequest(kind="stacks", reason=reason))
                except Exception:
                    log.exception("liveness: could not send a stack request")
        for run_id, r, detail in unresponsive:
            self._event(run_id, r, "unresponsive", detail)

    def _forget_quiet_runs(self) -> None:
        """Drop the runs nothing can happen to any more without new data (see the module's docstring)."""

        def quiet(rank: _Rank) -> bool:
            return (
                rank.stream is None
                and rank.answered
                and (rank.ended or (not rank.inflight and (not rank.last_beat_ns or rank.silent_asked)))
            )

        done = [run_id for run_id, ranks in self.runs.items() if all(quiet(r) for r in ranks.values())]
        for run_id in done:
            del self.runs[run_id]
        if done:
            gone = set(done)
            self._asked_for = {key for key in self._asked_for if key[0] not in gone}

    @staticmethod
    def _stuck(ranks: dict[int, _Rank]) -> dict:
        """(group, seq) -> (op, waiting ranks, threshold (hang_rule), members, earliest entry) over
        in-flight reports."""
        stuck: dict = {}
        for r, rank in ranks.items():
            if rank.ended:
                continue
            for key, (entered_ns, _, hang_after_s, group_members, op) in rank.inflight.items():
                entry = stuck.setdefault(key, [op, set(), [], group_members, entered_ns])
                entry[1].add(r)
                entry[2].append(hang_after_s)
                entry[4] = min(entry[4], entered_ns)
        return {k: (op, waiting, hang_rule.threshold(s), m, oldest) for k, (op, waiting, s, m, oldest) in stuck.items()}

    def _readable_now(self) -> None:
        """Have the store commit what it holds now (collector.server.store.Store.flush_soon)."""
        flush_soon = getattr(self.store, "flush_soon", None)  # a store that commits each submit has none
        if flush_soon is not None:
            flush_soon()

    def _event(self, run_id: str, rank: int, event: str, detail: str) -> None:
        row = pa.table(
            {
                "run_id": [run_id],
                "rank": [rank],
                "event": [event],
                "time": timestamp(time.time_ns()),
                "detail": [detail],
            },
            schema=RANK_EVENTS_SCHEMA,
        )
        try:
            self.store.submit(self._client_id, next(self._seq), [("rank_events", run_id, row)], lambda error: None)
            self._readable_now()  # a rank gone or unresponsive: news
        except Exception:  # the store is closing: the event is lost, the data is not
            log.warning("liveness: could not store %s of rank %d in %s", event, rank, run_id)
