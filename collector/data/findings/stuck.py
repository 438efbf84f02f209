"""Stuck collectives: in flight far beyond their own normal wait (collector.data.hang_rule's
adaptive rule), named within seconds, and the stacks of the ranks not arrived decide the words.

Input: one ``Stuck`` per collective the live collector (collector.server.liveness) judges stuck,
each with a ``Missing`` per member that has not entered it: where that rank is, as far as the
collector knows (its stream gone, silent, waiting in another collective, or its main thread's
latest stack). Plain values, no frames: the collector re-judges several times a second and
answers ``rankscope health`` from memory, so nothing here may cost an import of pandas.

What the missing ranks are doing makes the sentence and the severity:

* saving a checkpoint (``torch.save``, ``torch.distributed.checkpoint``, a function named for
  checkpoints): info, "rank 0 is saving a checkpoint; ranks 1-7 wait for it": the job is fine;
* in a data loader: a warning, "waiting for data";
* in a collective of another group (or another collective of this one): a warning that the ranks
  wait in different collectives, a desync;
* stream closed without ending the run: a warning, crashed or killed (the stored ``rank_stopped``
  finding says it critically once the collector has written it down);
* anywhere else: a warning naming the rank's innermost frame, or that its stack was asked for.

Past the collective's ``hang_after_s`` the same finding is the critical ``hang`` (whatever the
stacks say: a checkpoint that blocks the job that long is a hang to whoever set the threshold).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from collector.data.findings.model import Finding, ranks_label

MAX_NAMED = 4  # missing ranks whose whereabouts the sentence spells out

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_CHECKPOINT = re.compile(
    r'torch/serialization\.py", line \d+, in (save|_save)\b|torch/distributed/checkpoint/|'
    r"in \w*(save_checkpoint|checkpoint_save|save_state_dict|_save_to_state_dict)\b|in \w*checkpoint\w*\b",
    re.IGNORECASE,
)
_DATA = re.compile(
    r"torch/utils/data/|in _next_data\b|in \w*(data_?loader|dataloader)\w*\b|in (get|next|load|fetch)_?batch\b",
    re.IGNORECASE,
)
_COLLECTIVE = re.compile(r"torch/distributed/distributed_c10d\.py|deepspeed/comm/")


@dataclass(frozen=True)
class Missing:
    """Where a member that has not entered the collective is."""

    rank: int
    gone: bool = False  # its stream closed without RunEnd
    silent_s: float | None = None  # no heartbeat for this long (None: beating)
    elsewhere: tuple[str, int, str] | None = None  # (group, seq, op) it waits in instead
    stack: str = ""  # its main thread's latest stack captured since the collective got stuck
    innermost: str = ""


@dataclass(frozen=True)
class Stuck:
    group_name: str
    seq: int
    op: str
    step: int | None
    waiting: tuple[int, ...]
    missing: tuple[Missing, ...]
    waited_s: float
    normal_s: float | None  # the kind's normal wait (None: not learned yet)
    stuck_after_s: float
    hang_after_s: float
    extra: dict = field(default_factory=dict)


def activity(stack: str) -> str:
    """'checkpoint', 'data', 'collective' or 'other', from a main thread's stack (innermost last)."""
    if not stack:
        return "unknown"
    if _CHECKPOINT.search(stack):
        return "checkpoint"
    if _DATA.search(stack):
        return "data"
    if _COLLECTIVE.search(stack):
        return "collective"
    return "other"


def _place(m: Missing) -> str:
    """'train.py:120 in save' from the innermost frame the stack names."""
    frames = _FRAME.findall(m.stack)
    if frames:
        path, line, func = frames[-1]
        return f"{path.rsplit('/', 1)[-1]}:{line} in {func}"
    return m.innermost or "an unknown place"


def _cause(m: Missing) -> str:
    if m.gone:
        return "gone"
    if m.elsewhere is not None:
        return "desync"
    if m.silent_s is not None:
        return "silent"
    return activity(m.stack)


def _words(cause: str, ms: list[Missing]) -> str:
    who = f"{ranks_label([m.rank for m in ms])} {'is' if len(ms) == 1 else 'are'}"
    one = ms[0]
    if cause == "gone":
        return f"{who} gone (stream closed without ending the run): crashed or killed"
    if cause == "desync":
        g, s, op = one.elsewhere
        return f"{who} waiting in {op} #{s} of {g} instead (the ranks are in different collectives: a desync)"
    if cause == "silent":
        return f"{who} silent for {max(m.silent_s or 0 for m in ms):.0f} s (no heartbeat; process stopped or GIL held)"
    if cause == "checkpoint":
        return f"{who} saving a checkpoint (at {_place(one)})"
    if cause == "data":
        return f"{who} waiting for data (at {_place(one)})"
    if cause == "unknown":
        return f"{who} not there yet (stacks asked for)"
    if cause == "collective":
        return f"{who} inside a collective (at {_place(one)})"
    return f"{who} at {_place(one)}"


def stuck_collectives(stuck: list[Stuck]) -> list[Finding]:
    found = []
    for c in stuck:
        by_cause: dict[str, list[Missing]] = {}
        for m in sorted(c.missing, key=lambda m: m.rank):
            by_cause.setdefault(_cause(m), []).append(m)
        named = sorted(by_cause.items(), key=lambda kv: kv[1][0].rank)
        where = "; ".join(_words(cause, ms) for cause, ms in named[:MAX_NAMED])
        if len(named) > MAX_NAMED:
            where += f"; and {sum(len(ms) for _, ms in named[MAX_NAMED:])} more ranks elsewhere"
        causes = {cause for cause, _ in named}
        missing = [m.rank for m in c.missing]
        waiting = list(c.waiting)
        at = f"{c.op} #{c.seq} of {c.group_name}" + ("" if c.step is None else f" at step {c.step}")
        normal = "not learned yet" if c.normal_s is None else f"normally {1e3 * c.normal_s:.0f} ms"
        hung = c.waited_s >= c.hang_after_s
        if hung:
            kind, severity = "hang", "critical"
            text = f"hang: {ranks_label(waiting)} stuck {c.waited_s:.0f} s in {at}; not arrived: {where}"
        elif causes == {"checkpoint"}:
            kind, severity = "stuck", "info"
            wait = "waits" if len(waiting) == 1 else "wait"
            text = f"{where}; {ranks_label(waiting)} {wait} for it in {at} ({c.waited_s:.0f} s so far)"
        else:
            kind, severity = "stuck", "warning"
            text = (
                f"stuck: {ranks_label(waiting)} waiting {c.waited_s:.0f} s in {at} ({normal}), not arrived: {where}"
                if missing
                else f"stuck: {ranks_label(waiting)} waiting {c.waited_s:.0f} s in {at} ({normal}); every member has "
                "entered it (a backend or network stall)"
            )
        found.append(
            Finding(
                kind=kind,
                severity=severity,
                ranks=tuple(missing or waiting),
                steps=(c.step, c.step) if c.step is not None else None,
                text=text,
                evidence={
                    "group_name": c.group_name,
                    "seq": int(c.seq),
                    "op": c.op,
                    "waiting_ranks": waiting,
                    "missing_ranks": missing,
                    "waiting_s": round(float(c.waited_s), 1),
                    "normal_s": c.normal_s,
                    "stuck_after_s": float(c.stuck_after_s),
                    "hang_after_s": float(c.hang_after_s),
                    "causes": {cause: [m.rank for m in ms] for cause, ms in named},
                    "stacks": {str(m.rank): m.stack for m in c.missing[:MAX_NAMED] if m.stack},
                    **c.extra,
                },
                page="liveness",
            )
        )
    return found
