"""Evidence without a person: when a finding appears live, ask the ranks it names to capture it.

Fed the findings of each live run by the collector's periodic refresh (collector.server.metrics,
which also feeds the alert webhook), at most every few seconds per run:

* a ``straggler`` or ``slow_link`` finding, warning or critical: the suspect ranks (at most
  MAX_SUSPECTS) and one healthy reference rank profile their next ``steps`` steps, with Python
  stacks (collector.server.commands -> collector.rank.capture); the reference is a rank the
  finding does not name, on the first suspect's host where one streams, and of those the one
  whose recent busy time (step time less waiting) is nearest their median;
* a ``hang``: the ranks it names send their stacks;
* ``memory_growth``: the ranks it names report their memory;
* with a ``prober`` (``rankscope collect --auto-probe``, off by default: it puts bytes on the slow
  link): a ``slow_link`` finding that leaves an "or" between hosts has their links timed
  (collector.server.probe), on a thread of its own, once per run and set of hosts; the next refresh's
  finding reads the probe's rows and names the host where it was decisive.

A finding whose slowness is over (a straggler "was slow in steps a-b, not since") asks no one:
the steps a profile would capture are healthy ones.

Only ranks streaming to this collector now are asked (the findings of a finished run ask no one).
Rate limits: a finding (run, kind, severity, ranks) escalates once; a run at most once per
``run_interval_s``; a rank at most once per ``rank_interval_s``. On by default (``rankscope collect
--no-auto-profile`` switches it off). A capture's Python stacks are sampled
(collector.rank.stack_sampler), which bounds what it costs the profiled rank; how a capture is kept
from taking a rank down: collector.rank.capture. What was asked is in ``asked`` (and, as the ranks
answer, in the run's ``artifacts`` rows, whose ``finding`` column carries the finding's sentence).
"""

from __future__ import annotations

import logging
import threading
import time

import pandas as pd

from collector.data.findings import Finding
from collector.data.findings.links import hosts_in_doubt
from proto import pb

log = logging.getLogger("rankscope.escalation")

PROFILE_KINDS = ("straggler", "slow_link")
SEVERITIES = ("warning", "critical")
MAX_SUSPECTS = 4
SEEN_KEPT = 100_000  # findings remembered as escalated (the oldest are forgotten beyond)
RECENT_STEPS = 20  # of step analysis, for the reference's busy time


class Escalation:
    def __init__(
        self,
        commands,
        *,
        steps: int = 3,
        run_interval_s: float = 300.0,
        rank_interval_s: float = 900.0,
        profile: bool = True,
        prober=None,
    ) -> None:
        self.commands = commands
        self.profile, self.prober = profile, prober
        self.probes: list[threading.Thread] = []  # the probes started (tests join them)
        self.steps = steps
        self.run_interval_s, self.rank_interval_s = run_interval_s, rank_interval_s
        self._lock = threading.Lock()
        self._seen: dict[tuple, None] = {}  # insertion-ordered: the oldest go first
        self._run_last: dict[str, float] = {}
        self._rank_last: dict[tuple[str, int], float] = {}
        self.asked: list[tuple[str, str, dict[int, str], str]] = []  # (run_id, request id, rank -> role, finding)

    def offer(self, run_id: str, found: list[Finding], steps: pd.DataFrame | None = None) -> list[str]:
        """Escalate what is new among ``found`` (one run's findings); the request ids sent."""
        sent = []
        for finding in found:
            if finding.severity not in SEVERITIES or not finding.ranks:
                continue
            if (finding.evidence or {}).get("pattern") == "transient":
                continue  # "was slow in steps a-b, not since": the next steps would show it healthy
            if finding.kind == "slow_link" and self.prober is not None:
                self._probe(run_id, finding)
            kind = _request_kind(finding.kind)
            if kind is None or (kind == "profile" and not self.profile):
                continue
            key = (run_id, finding.kind, finding.severity, tuple(finding.ranks))
            with self._lock:
                if key in self._seen:
                    continue
                now = time.monotonic()
                if now - self._run_last.get(run_id, float("-inf")) < self.run_interval_s:
                    continue  # asked about this run lately: the finding waits (it is not marked seen)
                self._seen[key] = None
                if len(self._seen) > SEEN_KEPT:
                    del self._seen[next(iter(self._seen))]
            try:
                request_id = self._ask(run_id, finding, kind, steps, now)
            except Exception:  # evidence is a bonus: never a reason for the refresh to fail
                log.exception("escalation: could not ask run %s about its %s finding", run_id, finding.kind)
                continue
            if request_id:
                sent.append(request_id)
        return sent

    def _probe(self, run_id: str, finding: Finding) -> None:
        """Time the links of the hosts a slow-link finding leaves, once per run and hosts."""
        candidates = hosts_in_doubt(finding)
        if len(finding.evidence.get("hosts", [])) < 2 or finding.evidence.get("end_step") is not None:
            return  # named alone already, or over: a probe now would time healthy links
        key = (run_id, "probe", tuple(candidates))
        with self._lock:
            if key in self._seen:
                return
            self._seen[key] = None

        def probe() -> None:
            try:
                report = self.prober.run(run_id, candidates=candidates)
                log.info("escalation: probed run %s's links of %s: %s", run_id, ", ".join(candidates), report.sentence)
            except Exception as exc:  # evidence is a bonus
                log.warning("escalation: could not probe run %s's links of %s: %s", run_id, ", ".join(candidates), exc)

        thread = threading.Thread(target=probe, name="rankscope-auto-probe", daemon=True)
        self.probes.append(thread)
        thread.start()

    def _ask(self, run_id: str, finding: Finding, kind: str, steps, now: float) -> str | None:
        streams = self.commands.liveness.streams_of(run_id)
        with self._lock:
            fresh = [
                r
                for r in finding.ranks[:MAX_SUSPECTS]
                if r in streams and now - self._rank_last.get((run_id, r), float("-inf")) >= self.rank_interval_s
            ]
        if not fresh:
            return None
        roles = dict.fromkeys(fresh, "suspect")
        if kind == "profile":
            reference = pick_reference(streams, set(finding.ranks), fresh[0], steps)
            if reference is None:
                return None  # nothing to compare with: a trace alone is not evidence enough to ask for
            roles[reference] = "reference"
        request = pb.RankRequest(
            kind=kind,
            steps=self.steps if kind == "profile" else 0,
            with_stack=kind == "profile",
            reason=f"{finding.severity} {finding.kind} finding",
            finding=finding.text[:2000],
        )
        reply = self.commands.send(run_id, list(roles), request, roles=roles)
        with self._lock:
            self._run_last[run_id] = now
            for r in reply.sent:
                self._rank_last[(run_id, r)] = now
            self.asked.append((run_id, reply.request_id, {r: roles[r] for r in reply.sent}, finding.text))
        log.info("escalation: asked run %s ranks %s to %s (%s)", run_id, dict(roles), kind, finding.text[:120])
        return reply.request_id


def _request_kind(finding_kind: str) -> str | None:
    if finding_kind in PROFILE_KINDS:
        return "profile"
    return {"hang": "stacks", "memory_growth": "memory"}.get(finding_kind)


def pick_reference(streams: dict[int, tuple], suspects: set[int], first_suspect: int, steps) -> int | None:
    """A rank streaming here that the finding does not name: on ``first_suspect``'s host where
    possible, then nearest the median recent busy time (step less waiting), then the lowest."""
    candidates = [r for r in streams if r not in suspects]
    if not candidates:
        return None
    busy: dict[int, float] = {}
    if steps is not None and len(steps) and {"rank", "step", "step_ms", "waiting_ms"} <= set(steps.columns):
        recent = steps[steps.step > steps.step.max() - RECENT_STEPS]
        busy = (recent.step_ms - recent.waiting_ms.fillna(0)).groupby(recent["rank"]).median().to_dict()
    known = [busy[r] for r in candidates if r in busy]
    median = float(pd.Series(known).median()) if known else 0.0
    host = streams[first_suspect][1] if first_suspect in streams else ""

    def key(r: int):
        return (streams[r][1] != host, abs(busy.get(r, median) - median), r)

    return min(candidates, key=key)
