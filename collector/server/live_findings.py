"""The findings a running collector holds in memory, per run: one source for the Health RPC
(``rankscope health``'s fast path), /metrics' ``rankscope_findings`` and the alert webhook, so
they all say the same thing.

Two parts make a run's findings:

* the stored-data findings (collector.data.findings.for_run over the catalog), which the findings
  refresh (collector.server.metrics) computes every ``refresh_s`` for the runs streaming here and
  hands over with ``stored``;
* the live ones (collector.server.liveness: stuck and hung collectives, with where their missing
  ranks are, and collectives in flight entered with different shapes: desyncs), judged every
  ``liveness.CHECK_INTERVAL_S`` from what the streams report, and ranks gone without ending the run
  as soon as their streams close. They take the place of the stored ``stuck`` findings, of a stored
  ``hang`` or ``desync`` of the same collective and of the stored ``rank_stopped`` (the same story,
  told sooner; a stored ``silent_rank`` of ranks now gone too); every other stored finding stands.

When the live part changes (a collective gets stuck, a stack names where its missing rank is, it
leaves flight) the listeners (``listen``: the alert webhook) hear it from the liveness checker at
once, not at the next refresh.

A run is *held* while a rank of it streams here (or, once a rank went away without ending it, until a
refresh from rows that include every rank's end) and the refresh has computed its stored part at
least once, from rows that include the run's last news the live judgment does not tell (a rank
unresponsive; a collective that raised, where the stored part has a hang or desync it may end);
otherwise the Health RPC says so and ``rankscope health`` computes from the data dir, which has that
news as soon as the store commits it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("rankscope.live_findings")

REPLACED_BY_LIVE = ("stuck",)  # stored kinds the live judgment always replaces
TOLD_LIVE = ("hang", "desync")  # stored kinds it replaces where it tells of the same collective


class LiveFindings:
    def __init__(self, liveness) -> None:
        self.liveness = liveness
        # run_id -> (name, findings, when: monotonic, as of: rows submitted before this are in them)
        self._stored: dict[str, tuple[str, list, float, float]] = {}
        self._lock = threading.Lock()
        self._listeners: list[Callable] = []
        self._captured: dict[str, list[dict]] = {}  # run_id -> its captured evidence (trace_diff.run_evidence)
        liveness.on_change = self._live_changed

    def listen(self, listener: Callable[[str, str, list], None]) -> None:
        """``listener(run_id, run_name, findings)`` on each change of a run's live findings."""
        self._listeners.append(listener)

    def stored(
        self, run_id: str, name: str, found: list, as_of: float | None = None, captured: list | None = None
    ) -> None:
        """The refresh computed a run's findings from the stored data, which held every row submitted
        before ``as_of`` (monotonic; the store's ``visible_through`` as the refresh began; None: now),
        and ``captured``: the evidence captured of it (trace_diff.run_evidence), for the answer's JSON."""
        now = time.monotonic()
        with self._lock:
            self._stored[run_id] = (name, list(found), now, now if as_of is None else as_of)
            self._captured[run_id] = list(captured or ())

    def captured(self, run_id: str) -> list[dict]:
        """The run's captured evidence as of the last refresh."""
        with self._lock:
            return list(self._captured.get(run_id, []))

    def as_json(self, run_id: str, found: list) -> list[dict]:
        """``found`` as the Health RPC sends it: each finding's JSON with the captured evidence whose
        suspect it names (``captured``, as `rankscope health --json` gives it from the data dir)."""
        from collector.data.trace_diff import attach

        captured = self.captured(run_id)
        return [attach(f.to_json(), captured) for f in found]

    def keep(self, run_ids) -> None:
        """Forget the stored findings of runs the refresh no longer follows."""
        keep = set(run_ids)
        with self._lock:
            for run_id in [r for r in self._stored if r not in keep]:
                del self._stored[run_id]
                self._captured.pop(run_id, None)

    def name_of(self, run_id: str) -> str:
        with self._lock:
            stored = self._stored.get(run_id)
        return stored[0] if stored else self.liveness.name_of(run_id)

    def current(self, run_id: str) -> list:
        """The run's findings now: stored ones, with the live judgment in place of the stale one."""
        live = self.liveness.findings(run_id)
        with self._lock:
            stored = self._stored.get(run_id)
        found = list(stored[1]) if stored else []
        collectives = {(f.evidence.get("group_name"), f.evidence.get("seq")) for f in live}
        gone = {r for f in live if f.kind == "rank_stopped" for r in f.ranks}
        merged = [
            f
            for f in found
            if f.kind not in REPLACED_BY_LIVE
            and not (f.kind in TOLD_LIVE and (f.evidence.get("group_name"), f.evidence.get("seq")) in collectives)
            and not (gone and f.kind == "rank_stopped")
            and not (gone and f.kind == "silent_rank" and set(f.ranks) <= gone)
        ] + live
        from collector.data.findings.model import ranked

        return ranked(merged)

    def runs(self) -> list[str]:
        """Runs with stored findings, or live ones."""
        with self._lock:
            held = list(self._stored)
        return held + [r for r in self.liveness.streaming_runs() if r not in held and self.liveness.findings(r)]

    def resolve(self, run: str) -> str | None:
        """A run id or name (the newest run of that name followed here) -> its id; None if not followed."""
        found = self.liveness.resolve(run)
        if found is not None:
            return found
        with self._lock:  # the name the catalog knows (the refresh's), where the Hello gave none
            named = [run_id for run_id, (name, *_) in self._stored.items() if name == run]
        return named[-1] if named else None

    def answer(self, run: str) -> tuple[str | None, bool, list, float]:
        """(run id, held, findings, age of the stored part in s) for the Health RPC."""
        run_id = self.resolve(run)
        if run_id is None:
            return run_id, False, [], 0.0
        with self._lock:
            stored = self._stored.get(run_id)
        if stored is None:  # streaming, but not refreshed yet: the data dir has the whole story
            return run_id, False, [], 0.0
        if not self.liveness.holds(run_id):
            # a crash (a rank gone, the rest ended or gone) is told live until a refresh from rows that
            # include every rank's end (refresh_soon: a second or two); then, as for any run over, the data dir
            crashed_at = self.liveness.crashed_at(run_id)
            if crashed_at is None or stored[3] >= crashed_at:
                return run_id, False, [], 0.0
        # news since the rows of the last refresh that the live judgment does not tell: the data dir
        # names it now, the next refresh here in up to refresh_s (a rank gone is told live)
        untold = ("unresponsive", "failed") if any(f.kind in TOLD_LIVE for f in stored[1]) else ("unresponsive",)
        news = self.liveness.news_at(run_id, untold)
        if news is not None and news >= stored[3]:
            return run_id, False, [], 0.0
        return run_id, True, self.current(run_id), time.monotonic() - stored[2]

    def _live_changed(self, run_id: str) -> None:
        if not self._listeners:
            return
        found, name = self.current(run_id), self.name_of(run_id)
        for listener in self._listeners:
            try:
                listener(run_id, name, found)
            except Exception:
                log.exception("live findings: a listener failed")
