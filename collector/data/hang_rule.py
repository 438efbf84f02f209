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
"""

from __future__ import annotations

import math
from collections.abc import Iterable

DEFAULT_HANG_AFTER_S = 60.0  # a rank's setting when nothing sets it


def threshold(settings: Iterable[float | None]) -> float:
    """The threshold of a collective from the settings of the ranks waiting in it (or a run's
    ``hang_after_s`` from all its ranks' settings)."""
    return min((float(s) for s in settings if s is not None), default=math.inf)


def is_hung(waiting_s: float, threshold_s: float) -> bool:
    return waiting_s >= threshold_s


# over one collective's waiting rows (an aggregate: GROUP BY the instance)
THRESHOLD_SQL = "min(hang_after_s)"
HUNG_SQL = f"max(waiting_s) >= {THRESHOLD_SQL}"
