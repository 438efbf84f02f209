"""The collector's live view of every rank: who is stuck, who is missing, who went away.

Fed by what the streams deliver (``observe`` for each accepted envelope, ``closed``
when a stream ends), it keeps per run, in memory:

* each rank's stream (to send it requests), its last heartbeat and period;
* the collectives each rank reports in flight (collector.rank.watchdog's ``inflight``
  rows), with their group's members;
* each kind of collective's normal wait (collector.data.hang_rule: per group, op and size class,
  the worst wait of its recent completions), learned from the ``comm`` rows the ranks send (every
  one of a run's first ``EAGER_BATCHES`` batches, then at most ``LEARN_PER_S`` a second per run: a
  1,024-rank run teaches as much as an 8-rank one);
* each rank's latest main-thread stack.

A checker thread looks every ``CHECK_INTERVAL_S`` (so a stream's in-flight report is judged
within that, not at the findings refresh):

* a collective stuck by collector.data.hang_rule (in flight ``STUCK_FACTOR`` times its kind's
  normal wait and at least ``STUCK_FLOOR_S``; hung at the smallest ``hang_after_s`` of the ranks
  waiting in it): every member that is not waiting in it (missing) is asked for its Python
  stacks, once per collective, and the collective is a live finding (``findings(run_id)``,
  collector.data.findings.stuck) until it leaves flight; ``on_change`` hears when a run's live
  findings change (collector.server.live_findings: the Health RPC, /metrics and alerts);
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

The service talks to this module through three calls, ``observe(stream, env, rows)``,
``closed(stream)`` and ``stop()``, and gives it a ``stream`` object with
``request(pb.RankRequest)``; nothing here knows about gRPC threads, so a port of the
service to grpc.aio keeps this module as is.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from collector.data import hang_rule
from collector.data.codec import decode_batch
from collector.data.schema import RANK_EVENTS_SCHEMA, timestamp
from proto import pb

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 0.25
SILENT_AFTER_PERIODS = 3
ANSWER_WITHIN_S = 5.0
LEARN_PER_S = 20.0  # comm batches per run and second that teach the normal waits ...
EAGER_BATCHES = 16  # ... but for a run's first batches, which all do
ASK_AT_SHARE = 0.5  # missing ranks are asked for stacks this far to stuck, so the words are ready on time
GONE_HELD_S = 30.0  # a rank gone without ending the run is told live this long, then by the stored rows alone


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
    # (group, seq) -> (entered_ns, time_ns, hang_after_s, members, op, bytes, step, dtype, numel)
    inflight: dict = field(default_factory=dict)
    asked_at: float | None = None  # our monotonic clock, when we last asked for stacks
    answered: bool = True
    silent_asked: bool = False
    gone: bool = False  # its stream closed without RunEnd
    gone_ns: int = 0  # our clock (wall ns), when it did: the ``disconnected`` row's time
    ending: bool = False  # its last heartbeat said it is ending (as good as its RunEnd)
    left_at: float = 0.0  # our monotonic clock, when its RunEnd came or its stream closed, whichever was last
    stack: tuple[int, str, str] | None = None  # its main thread's latest stack: (time_ns, stack, innermost)


@dataclass
class _Normals:
    """A run's normal waits: (group, op, size class) -> the worst wait of each recent batch (s)."""

    waits: dict = field(default_factory=dict)
    learn_at: float = 0.0  # our monotonic clock: the next batch that may teach
    taught: int = 0  # batches that taught

    def normal(self, group: str, op: str, nbytes: int | None) -> float | None:
        return self._normal((group, op, hang_rule.size_class(nbytes)))

    def _normal(self, key: tuple) -> float | None:
        seen = self.waits.get(key)
        if seen is None or len(seen) < hang_rule.MIN_SAMPLES:
            return None
        return hang_rule.normal_wait(seen)

    def add(self, key: tuple, waits) -> None:
        """Learn ``waits`` (s) of a kind of collective, but for those that were stuck: a hang that
        resolved is no normal (the next one would wait five times as long to be named)."""
        normal = self._normal(key)
        limit = math.inf if normal is None else hang_rule.stuck_after(normal)
        kept = self.waits.setdefault(key, collections.deque(maxlen=hang_rule.NORMAL_WINDOW))
        kept.extend(w for w in waits if w < limit)

    def learn(self, comm: pa.Table) -> None:
        done = comm.filter(pc.is_valid(comm["end_ns"]))
        if not done.num_rows:
            return
        waits = pc.divide(pc.subtract(done["end_ns"], done["start_ns"]).cast(pa.float64()), 1e9)
        sizes = [hang_rule.size_class(b) for b in done["bytes"].to_pylist()]
        worst: dict = {}
        for key, wait in zip(zip(done["group_name"].to_pylist(), done["op"].to_pylist(), sizes), waits.to_pylist()):
            if wait is not None and wait > worst.get(key, -1.0):
                worst[key] = wait
        for key, wait in worst.items():
            self.add(key, [wait])


class Liveness:
    def __init__(self, store, *, answer_within_s: float = ANSWER_WITHIN_S, start: bool = True) -> None:
        self.store = store
        self.answer_within_s = answer_within_s
        self.runs: dict[str, dict[int, _Rank]] = {}
        self.normals: dict[str, _Normals] = {}
        self.names: dict[str, str] = {}  # run_id -> the name its Hello gave
        self.on_change = None  # called with a run id when its live findings change (from the checker)
        self.on_new_run = None  # called (no arguments) when a run not followed here says Hello
        self.on_rank_gone = None  # called (no arguments) when a rank's stream closes without RunEnd
        self._live: dict[str, list] = {}  # run_id -> its stuck collectives (findings.stuck.Stuck), last check
        self._desynced: dict[str, list] = {}  # run_id -> its mismatched collectives in flight, last check
        self._live_keys: dict[str, frozenset] = {}  # run_id -> what its live findings say, to tell a change
        self._asked_for: set[tuple] = set()  # (run_id, group, seq, rank): each missing rank asked once per hang
        # run_id -> news -> when (monotonic) it came last: a row the stored findings need, "failed" (a
        # collective that raised), "disconnected" (a rank gone: told live as well) or "unresponsive".
        self._news: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()
        self._client_id = f"rankscope-collector.{secrets.token_hex(6)}"
        self._seq = itertools.count(1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rankscope-liveness", daemon=True)
        if start:
            self._thread.start()

    # ---- fed by the service ----
    def observe(self, stream: RankStream, env: pb.Envelope, rows: list | None = None) -> None:
        """An accepted envelope (``rows``: what the codec made of it, (table, run_id, Arrow table)
        each); never raises (the live view must not cost a stream)."""
        try:
            body = env.WhichOneof("body")
            if body == "hello":
                with self._lock:
                    new_run = env.hello.run_id not in self.runs
                    rank = self._rank(env.hello.run_id, env.hello.rank)
                    rank.stream, rank.ended, rank.host = stream, False, env.hello.host
                    rank.gone, rank.gone_ns, rank.ending = False, 0, False
                    self.names[env.hello.run_id] = env.hello.run_name or env.hello.run_id
                    rank.last_seen = rank.last_seen or time.monotonic()
                if new_run and self.on_new_run is not None:
                    self.on_new_run()
            elif body == "end":
                with self._lock:
                    rank = self._rank(env.end.run_id, env.end.rank)
                    rank.ended, rank.left_at = True, time.monotonic()
            elif body == "table" and env.table.table in ("heartbeats", "inflight", "stacks"):
                self._table(stream, env.table)
            elif body == "table" and env.table.table == "comm" and rows:
                self._learn(env.table.run_id, rows)
        except Exception:
            log.exception("liveness: could not read envelope seq %d", env.seq)

    def closed(self, stream: RankStream) -> None:
        """A stream ended: ranks it carried that did not end the run are gone."""
        gone = []
        now_ns = time.time_ns() // 1000 * 1000  # as the row stores it (us)
        with self._lock:
            for run_id, ranks in self.runs.items():
                for r, rank in ranks.items():
                    if rank.stream is stream:
                        rank.stream, rank.left_at = None, time.monotonic()
                        if not rank.ended:
                            rank.gone, rank.gone_ns = True, now_ns
                            gone.append((run_id, r))
        for run_id, r in gone:
            self._event(run_id, r, "disconnected", "the stream closed without RunEnd", now_ns)
        for run_id in sorted({run_id for run_id, _ in gone}):
            self._tell_change(run_id)  # a rank gone is a live finding (``findings``): alerts hear it now
        if gone and self.on_rank_gone is not None:
            self.on_rank_gone()  # the stored findings catch up with the gone rank's last rows

    def streaming_runs(self) -> set[str]:
        """The runs with a rank whose stream is open here now."""
        with self._lock:
            return {run_id for run_id, ranks in self.runs.items() if any(r.stream is not None for r in ranks.values())}

    def streams_of(self, run_id: str) -> dict[int, tuple[RankStream, str]]:
        """rank -> (its open stream, its host), for the ranks of ``run_id`` streaming here and not ended
        (what a command can reach: collector.server.commands)."""
        with self._lock:
            ranks = self.runs.get(run_id, {}).items()
            return {r: (rank.stream, rank.host) for r, rank in ranks if _streaming(rank)}

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)

    def _rank(self, run_id: str, rank: int) -> _Rank:
        return self.runs.setdefault(run_id, {}).setdefault(rank, _Rank())

    def _learn(self, run_id: str, rows: list) -> None:
        now = time.monotonic()
        with self._lock:
            normals = self.normals.setdefault(run_id, _Normals())
            # a run's first EAGER_BATCHES batches all teach: its warm-up batches (sent by all ranks within
            # a few ms) would otherwise teach one each 1/LEARN_PER_S, leaving a short run's kinds unlearned
            if now < normals.learn_at and normals.taught >= EAGER_BATCHES:
                return
            normals.learn_at, normals.taught = now + 1.0 / LEARN_PER_S, normals.taught + 1
        for table, _, comm in rows:
            if table == "comm":
                learned = _Normals()
                learned.learn(comm)  # outside the lock: the checker never waits on Arrow
                with self._lock:
                    for key, waits in learned.waits.items():
                        normals.add(key, waits)

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
                        rank.ending = bool(row.get("ending"))
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
                        self._news.setdefault(batch.run_id, {})["failed"] = now
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
                        row["bytes"],
                        row["step"],
                        row["dtype"],
                        row["numel"],
                    )
            else:  # stacks: an answer (or a capture of its own, which answers as well)
                rank.answered = True
                for row in rows:
                    if row["is_main"] and (rank.stack is None or (row["time_ns"] or 0) >= rank.stack[0]):
                        rank.stack = (row["time_ns"] or 0, row["stack"] or "", row["innermost"] or "")
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
        live: dict[str, list] = {}
        desynced: dict[str, list] = {}  # run_id -> its mismatched collectives in flight (queries.desyncs rows)
        with self._lock:
            for run_id, ranks in self.runs.items():
                normals = self.normals.get(run_id) or _Normals()
                for key, (op, waiting, threshold_s, group_members, oldest_ns, nbytes, step, sides) in self._stuck(
                    ranks
                ).items():
                    mismatch = self._mismatch(key, sides)
                    if mismatch is not None:  # a desync, told as one at once: no wait makes it a hang
                        desynced.setdefault(run_id, []).append(mismatch)
                        continue
                    waited_s = (now_ns - oldest_ns) / 1e9
                    normal_s = normals.normal(key[0], op, nbytes)
                    stuck_after_s = hang_rule.stuck_after(normal_s, threshold_s)
                    if not hang_rule.is_hung(waited_s, ASK_AT_SHARE * stuck_after_s):
                        continue
                    group, seq = key
                    for m in group_members:
                        if m in waiting or (run_id, group, seq, m) in self._asked_for:
                            continue
                        self._asked_for.add((run_id, group, seq, m))
                        rank = ranks.get(m)
                        if rank is not None and not rank.ended:
                            asks.append((rank, f"missing from {op} #{seq} of {group}"))
                    if not hang_rule.is_hung(waited_s, stuck_after_s):
                        continue
                    live.setdefault(run_id, []).append(
                        (
                            key,
                            op,
                            step,
                            waiting,
                            group_members,
                            oldest_ns,
                            waited_s,
                            normal_s,
                            stuck_after_s,
                            threshold_s,
                        )
                    )
                for r, rank in ranks.items():
                    silent = now - rank.last_seen > SILENT_AFTER_PERIODS * rank.period_s
                    if silent and rank.last_beat_ns and not rank.ended and not rank.gone and not rank.silent_asked:
                        rank.silent_asked = True
                        asks.append((rank, f"silent for {now - rank.last_seen:.0f} s"))
                    if not rank.answered and rank.asked_at is not None and now - rank.asked_at > self.answer_within_s:
                        rank.answered = True  # reported once per request
                        unresponsive.append((run_id, r, f"no stacks within {self.answer_within_s:g} s of asking"))
            for rank, _ in asks:
                rank.asked_at, rank.answered = now, False
            changed = self._judge(live, now)
            for run_id in set(desynced) | set(self._desynced):
                rows = desynced.get(run_id, [])
                if [(r["group_name"], r["seq"]) for r in rows] != [
                    (r["group_name"], r["seq"]) for r in self._desynced.get(run_id, [])
                ]:
                    changed.append(run_id)
                if rows:
                    self._desynced[run_id] = rows
                else:
                    self._desynced.pop(run_id, None)
            self._forget_quiet_runs()
        for rank, reason in asks:
            if rank.stream is not None:
                try:
                    rank.stream.request(pb.RankRequest(kind="stacks", reason=reason))
                except Exception:
                    log.exception("liveness: could not send a stack request")
        for run_id, r, detail in unresponsive:
            self._event(run_id, r, "unresponsive", detail)
        for run_id in changed:
            self._tell_change(run_id)

    def _tell_change(self, run_id: str) -> None:
        if self.on_change is not None:
            try:
                self.on_change(run_id)
            except Exception:
                log.exception("liveness: a listener of live findings failed")

    def findings(self, run_id: str) -> list:
        """The run's live findings as of the last check: its stuck and hung collectives, with where
        their missing ranks are (collector.data.findings.stuck), its collectives in flight entered
        with different shapes (collector.data.findings.desync), and its ranks gone without ending the
        run (collector.data.findings.silent's ``rank_stopped``, as the stored rows will tell it)."""
        with self._lock:
            stuck = list(self._live.get(run_id, ()))
            desynced = list(self._desynced.get(run_id, ()))
            gone = [
                (r, rank.step, rank.period_s, rank.gone_ns)
                for r, rank in self.runs.get(run_id, {}).items()
                if _told_gone(rank)
            ]
        found = []
        if gone:
            found += _stopped(gone)
        if stuck:
            from collector.data.findings.stuck import stuck_collectives  # pandas-free, but the package is not

            found += stuck_collectives(stuck)
        if desynced:
            import pandas as pd

            from collector.data.findings.desync import mismatched_collectives

            found += mismatched_collectives(pd.DataFrame(desynced))
        return found

    def name_of(self, run_id: str) -> str:
        with self._lock:
            return self.names.get(run_id, run_id)

    def news_at(self, run_id: str, kinds: tuple[str, ...] = ("failed", "disconnected", "unresponsive")) -> float | None:
        """When (monotonic) the run last got news of these kinds (see ``_news``), if it did."""
        with self._lock:
            news = self._news.get(run_id, {})
            return max((news[k] for k in kinds if k in news), default=None)

    def resolve(self, run: str) -> str | None:
        """A run id, or a name (the newest run of that name followed here), -> the run's id."""
        with self._lock:
            if run in self.runs:
                return run
            named = [run_id for run_id in self.runs if self.names.get(run_id) == run]
        return named[-1] if named else None

    def holds(self, run_id: str) -> bool:
        """Whether this collector follows the run live: some rank of it streams here and has not
        ended (once every rank sent its RunEnd, the data dir has the last word, not a refresh made
        before the last steps arrived)."""
        with self._lock:
            return any(_streaming(r) for r in self.runs.get(run_id, {}).values())

    def crashed_at(self, run_id: str) -> float | None:
        """When (monotonic) the last rank of a run that no rank streams to any more left, if a rank of it
        went away without ending it (told live, ``findings``); None otherwise. Findings refreshed from
        rows before then are told with the live ``rank_stopped`` (collector.server.live_findings)."""
        with self._lock:
            ranks = self.runs.get(run_id, {}).values()
            if any(_streaming(r) for r in ranks) or not any(_told_gone(r) for r in ranks):
                return None
            return max(r.left_at for r in ranks)

    def _judge(self, live: dict, now: float) -> list[str]:
        """Turn this check's stuck collectives into findings.stuck's input (under the lock); the
        runs whose live findings changed."""
        if not live and not self._live:
            return []
        from collector.data.findings.stuck import MAX_NAMED, Missing, Stuck, activity

        judged: dict[str, list] = {}
        for run_id, entries in live.items():
            ranks = self.runs[run_id]
            for key, op, step, waiting, group_members, oldest_ns, waited_s, normal_s, stuck_s, hang_s in entries:
                missing, pending = [], False
                for m in group_members:
                    if m in waiting:
                        continue
                    rank = ranks.get(m)
                    if rank is None:
                        missing.append(Missing(rank=m))
                        continue
                    elsewhere = [(k, v) for k, v in rank.inflight.items() if k != key]
                    silent_s = now - rank.last_seen
                    stack = rank.stack if rank.stack is not None and rank.stack[0] >= oldest_ns else None
                    if stack is None and not rank.gone and not elsewhere and len(missing) < MAX_NAMED:
                        # its stack is on its way: the words wait for it (a checkpoint is no warning)
                        asked = rank.asked_at is not None and now - rank.asked_at < self.answer_within_s
                        pending = pending or (
                            asked and not rank.ended and silent_s <= SILENT_AFTER_PERIODS * rank.period_s
                        )
                    missing.append(
                        Missing(
                            rank=m,
                            gone=rank.gone,
                            silent_s=silent_s if silent_s > SILENT_AFTER_PERIODS * rank.period_s else None,
                            elsewhere=(
                                (lambda k, v: (k[0], int(k[1]), v[4]))(*min(elsewhere, key=lambda kv: kv[1][0]))
                                if elsewhere
                                else None
                            ),
                            stack=stack[1] if stack else "",
                            innermost=stack[2] if stack else "",
                        )
                    )
                if pending:
                    previous = [c for c in self._live.get(run_id, ()) if (c.group_name, c.seq) == key]
                    judged.setdefault(run_id, []).extend(previous)  # as judged before, if it was
                    continue
                judged.setdefault(run_id, []).append(
                    Stuck(
                        group_name=key[0],
                        seq=int(key[1]),
                        op=op,
                        step=None if step is None else int(step),
                        waiting=tuple(sorted(waiting)),
                        missing=tuple(missing),
                        waited_s=waited_s,
                        normal_s=normal_s,
                        stuck_after_s=stuck_s,
                        hang_after_s=hang_s,
                    )
                )
        changed = []
        for run_id in set(judged) | set(self._live):
            stuck = judged.get(run_id, [])
            keys = frozenset(
                (c.group_name, c.seq, c.waited_s >= c.hang_after_s, tuple((m.rank, m.gone, m.elsewhere is not None,
                 m.silent_s is not None, activity(m.stack)) for m in c.missing))
                for c in stuck
            )  # fmt: skip
            if keys != self._live_keys.get(run_id, frozenset()):
                changed.append(run_id)
            if stuck:
                self._live[run_id], self._live_keys[run_id] = stuck, keys
            else:
                self._live.pop(run_id, None)
                self._live_keys.pop(run_id, None)
        return changed

    def _forget_quiet_runs(self) -> None:
        """Drop the runs nothing can happen to any more without new data (see the module's docstring)."""

        gone_before_ns = time.time_ns() - int(GONE_HELD_S * 1e9)

        def quiet(rank: _Rank) -> bool:
            return (
                rank.stream is None
                and rank.answered
                and (
                    rank.ended
                    or (rank.gone and (not rank.last_beat_ns or rank.gone_ns < gone_before_ns))
                    or (not rank.gone and not rank.inflight and (not rank.last_beat_ns or rank.silent_asked))
                )
            )

        done = [run_id for run_id, ranks in self.runs.items() if all(quiet(r) for r in ranks.values())]
        for run_id in done:
            del self.runs[run_id]
            self.normals.pop(run_id, None)
            self.names.pop(run_id, None)
            self._news.pop(run_id, None)
        if done:
            gone = set(done)
            self._asked_for = {key for key in self._asked_for if key[0] not in gone}

    @staticmethod
    def _stuck(ranks: dict[int, _Rank]) -> dict:
        """(group, seq) -> (op, waiting ranks, threshold (hang_rule), members, earliest entry, bytes,
        step, sides: (op, dtype, numel) -> ranks) over in-flight reports."""
        stuck: dict = {}
        for r, rank in ranks.items():
            if rank.ended:
                continue
            for key, (entered_ns, _, hang_after_s, members_, op, nbytes, step, dtype, numel) in rank.inflight.items():
                entry = stuck.setdefault(key, [op, set(), [], members_, entered_ns, nbytes, step, {}])
                entry[1].add(r)
                entry[2].append(hang_after_s)
                entry[4] = min(entry[4], entered_ns)
                entry[7].setdefault((op, dtype, numel), []).append(r)
        return {
            k: (op, waiting, hang_rule.threshold(s), m, oldest, nbytes, step, sides)
            for k, (op, waiting, s, m, oldest, nbytes, step, sides) in stuck.items()
        }

    @staticmethod
    def _mismatch(key: tuple, sides: dict) -> dict | None:
        """A desync row (queries.desyncs' form) where the ranks in flight in one collective entered it
        with a different op, dtype or element count (findings.desync's rule); None where they agree.
        Point-to-point groups are left out, as the stored rule leaves them (send and recv differ)."""
        if len(sides) < 2 or str(key[0]).startswith("p2p["):
            return None
        from collector.data.findings.desync import differing_fields

        listed = sorted(
            (
                {"op": op, "dtype": dtype, "numel": numel, "ranks": sorted(rs)}
                for (op, dtype, numel), rs in sides.items()
            ),
            key=lambda side: (-len(side["ranks"]), side["ranks"]),
        )
        if not differing_fields(listed):
            return None
        return {"group_name": key[0], "seq": int(key[1]), "sides": listed, "n_sides": len(listed)}

    def _readable_now(self) -> None:
        """Have the store commit what it holds now (collector.server.store.Store.flush_soon)."""
        flush_soon = getattr(self.store, "flush_soon", None)  # a store that commits each submit has none
        if flush_soon is not None:
            flush_soon()

    def _event(self, run_id: str, rank: int, event: str, detail: str, at_ns: int | None = None) -> None:
        row = pa.table(
            {
                "run_id": [run_id],
                "rank": [rank],
                "event": [event],
                "time": timestamp(at_ns or time.time_ns()),
                "detail": [detail],
            },
            schema=RANK_EVENTS_SCHEMA,
        )
        try:
            self.store.submit(self._client_id, next(self._seq), [("rank_events", run_id, row)], lambda error: None)
            with self._lock:
                self._news.setdefault(run_id, {})[event] = time.monotonic()
            self._readable_now()  # a rank gone or unresponsive: news
        except Exception:  # the store is closing: the event is lost, the data is not
            log.warning("liveness: could not store %s of rank %d in %s", event, rank, run_id)


def _streaming(rank: _Rank) -> bool:
    """A rank whose stream is open here and has not ended the run."""
    return rank.stream is not None and not rank.ended


def _told_gone(rank: _Rank) -> bool:
    """A rank gone without ending the run, as the stored rows judge it (``rank_liveness``: one that beat)."""
    return rank.gone and not rank.ended and not rank.ending and bool(rank.last_beat_ns)


def _stopped(gone: list[tuple[int, int, float, int]]) -> list:
    """The ``rank_stopped`` finding of ranks gone without ending the run ((rank, last beat's step,
    period, when it went: wall ns) each), worded by collector.data.findings.silent as from the
    stored rows (``rank_liveness``), which hold the same steps and times."""
    import pandas as pd

    from collector.data.findings.silent import silent_ranks

    rows = pd.DataFrame(
        [
            {"rank": r, "step": step, "period_s": period_s, "silent_s": 0.0, "behind_s": 0.0, "ended": False}
            | {"gone": True, "gone_ns": gone_ns, "unresponsive": False, "run_status": "running"}
            for r, step, period_s, gone_ns in sorted(gone)
        ]
    )
    return [f for f in silent_ranks(rows) if f.kind == "rank_stopped"]
