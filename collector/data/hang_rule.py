"""The hang rule, in one place: when a collective counts as hung, and whose setting decides.

Each rank has a ``hang_after_s`` (``attach(hang_after_s=...)``, ``RANKSCOPE_HANG_AFTER_S``,
``telemetry.hang_after_s``; DEFAULT_HANG_AFTER_S, resolved by collector.rank.session) and sends it
with every heartbeat and in-flight report. A collective is hung once a rank has waited in it for
at least its *threshold*: the smallest ``hang_after_s`` among the ranks waiting in it (a rank that
asked to hear after 5 s hears after 5 s, whatever the others set). A rank that sent no setting
(NULL: no rank of rankscope's does) has no say; a collective none of whose waiting ranks sent one
is never judged hung, as SQL's ``min`` over NULLs gives NULL. A run's ``hang_after_s`` is the
smallest its ranks sent: how long a run may sit without a new collective before it is taken for
stuck.

Who applies it: the rank's watchdog (collector.rank.watchdog: when to report the wait at once and
capture stacks), the collector's live view (collector.server.liveness: when to ask the missing
ranks for stacks), the catalog's ``hangs`` view and queries' ``hangs`` (what ``rankscope health``
names), and retention (collector.server.retention: a run stalled that long has its settled steps
rolled up without waiting for a full window). The SQL forms below are the same rule over rows
with ``waiting_s`` and ``hang_after_s`` columns.

Stuck, sooner (adaptive, on by default): before a collective is hung it can be *stuck*. The live
collector learns from the run itself how long each kind of collective normally keeps a rank
waiting, per (group, op, size class): ``normal_wait`` of its recent completions (the worst wait
of each of ``NORMAL_WINDOW`` batches; waits that were themselves stuck are not learned). A
collective in flight ``STUCK_FACTOR`` times its normal, and at least ``STUCK_FLOOR_S``, is stuck: a
warning that names who has not arrived and where they
are (collector.data.findings.stuck), seconds after it began instead of ``hang_after_s``. A kind
of collective seen fewer than ``MIN_SAMPLES`` times has no normal yet and waits
``UNLEARNED_STUCK_S`` (a first checkpoint barrier, the set-up collectives while slow ranks are
still importing). The floor keeps ordinary stalls quiet: a 1 s data-loader hiccup, a slow first
step, scheduler noise on a loaded host.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

DEFAULT_HANG_AFTER_S = 60.0  # a rank's setting when nothing sets it

STUCK_FLOOR_S = 3.0  # never stuck sooner: longer than a data-loader hiccup or a slow first step
STUCK_FACTOR = 5.0  # stuck at this many times the kind's normal wait
UNLEARNED_STUCK_S = 10.0  # a kind of collective without a normal yet
MIN_SAMPLES = 3  # completions (batches' worst waits) before a normal is trusted
NORMAL_WINDOW = 64  # batches whose worst wait make up a kind's normal
NORMAL_QUANTILE = 0.9


def size_class(nbytes: int | None) -> int:
    """Collectives of the same op and group wait alike within a power of four of bytes
    (0: no payload, a barrier)."""
    n = int(nbytes or 0)
    return 0 if n <= 0 else 1 + (n.bit_length() - 1) // 2


def normal_wait(worst_waits) -> float:
    """A kind of collective's normal wait from the worst wait of each recent batch: their 90th
    percentile (nearest rank), so one long wait among many (a 2 s data-loader stall) does not make
    the next hang wait five times as long to be named."""
    ordered = sorted(worst_waits)
    return ordered[min(len(ordered) - 1, math.ceil(NORMAL_QUANTILE * len(ordered)) - 1)]


def stuck_after(normal_s: float | None, hang_after_s: float = math.inf) -> float:
    """Seconds in flight after which a collective whose kind normally waits ``normal_s`` (None:
    not learned yet) is stuck; never later than its hang threshold."""
    adaptive = UNLEARNED_STUCK_S if normal_s is None else max(STUCK_FLOOR_S, STUCK_FACTOR * normal_s)
    return min(adaptive, hang_after_s)


def threshold(settings: Iterable[float | None]) -> float:
    """The threshold of a collective from the settings of the ranks waiting in it (or a run's
    ``hang_after_s`` from all its ranks' settings)."""
    return min((float(s) for s in settings if s is not None), default=math.inf)


def is_hung(waiting_s: float, threshold_s: float) -> bool:
    return waiting_s >= threshold_s


# over one collective's waiting rows (an aggregate: GROUP BY the instance)
THRESHOLD_SQL = "min(hang_after_s)"
HUNG_SQL = f"max(waiting_s) >= {THRESHOLD_SQL}"
