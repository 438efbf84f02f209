"""What the collector received from ranks' spool files of earlier runs, and telling people so.

A rank that reaches its collector resends the spool files that exited processes of the same
user on its host left for that endpoint (collector.rank.resend), on streams marked with the
call metadata ``RESEND_KEY``. Those records are real telemetry of runs the user started
earlier, but to a new user they look like "runs nobody started": so the collector counts what
such streams store (records and runs), says it in its log ("resent N records of K earlier runs
spooled for this endpoint", at most every ``LOG_EVERY_S`` and once more at exit), on /metrics,
and in ``D/resends.json`` which ``rankscope health`` reads to say it beside a run that came that
way. ``rankscope collect --no-resends`` refuses such streams (FAILED_PRECONDITION): the ranks
keep the files.

``D/resends.json``: ``{"records": N, "runs": {run_id: records}}``, the totals since the data
dir was made, replaced atomically (a write that fails, e.g. on a full disk, is tried again at
the next resend; the counts in memory are not lost).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger("rankscope.collector")

FILE_NAME = "resends.json"
LOG_EVERY_S = 2.0
REFUSED = "this collector takes no resent spool files (rankscope collect --no-resends); they stay in the rank's spool"


class Resends:
    """The counts of one collector (thread-safe), loaded from and saved to its data dir."""

    def __init__(self, data_dir: Path):
        self.path = Path(data_dir) / FILE_NAME
        saved = load(data_dir)
        self.records = int(saved.get("records", 0))
        self.runs: dict[str, int] = dict(saved.get("runs", {}))
        self._lock = threading.Lock()
        self._since_log = 0  # records taken since the last log line
        self._logged_at = 0.0
        self._dirty = False

    def stored(self, run_id: str, records: int) -> None:
        """A resend stream's envelope of ``records`` rows of ``run_id`` was stored."""
        with self._lock:
            self.records += records
            self.runs[run_id] = self.runs.get(run_id, 0) + records
            self._since_log += records
            self._dirty = True

    def stream_ended(self) -> None:
        """A resend stream ended: save the counts, say them (not more than every LOG_EVERY_S)."""
        self._save()
        with self._lock:
            due = self._since_log and time.monotonic() - self._logged_at >= LOG_EVERY_S
        if due:
            self._say()

    def close(self) -> None:
        self._save()
        if self._since_log:
            self._say()

    def _say(self) -> None:
        with self._lock:
            self._since_log, self._logged_at = 0, time.monotonic()
            text = summary(self.records, self.runs)
        log.warning("%s (rankscope collect --no-resends refuses them)", text)

    def _save(self) -> None:
        with self._lock:
            if not self._dirty:
                return
            body = json.dumps({"records": self.records, "runs": self.runs}, indent=1)
            self._dirty = False
        tmp = self.path.with_name(FILE_NAME + ".tmp")
        try:
            tmp.write_text(body)
            os.replace(tmp, self.path)
        except OSError as e:
            with self._lock:
                self._dirty = True
            log.warning("cannot save %s (%s); the counts are kept and saved at the next resend", self.path, e)


def load(data_dir) -> dict:
    """The saved counts, ``{}`` when none (or the file is unreadable: they are only a report)."""
    try:
        saved = json.loads((Path(data_dir) / FILE_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) and isinstance(saved.get("runs", {}), dict) else {}


def summary(records: int, runs: dict) -> str:
    return (
        f"resent {records} records of {len(runs)} earlier run{'s' * (len(runs) != 1)} spooled for this endpoint "
        "by ranks' processes that had exited"
    )


def note_for_run(data_dir, run_id: str) -> str | None:
    """For ``rankscope health``: a line when ``run_id`` (some of it) came from resent spool files."""
    saved = load(data_dir)
    runs = saved.get("runs", {})
    if run_id not in runs:
        return None
    return (
        f"{runs[run_id]} records of this run reached the collector from spool files resent after its ranks had "
        f"exited (the collector {summary(int(saved.get('records', 0)), runs)})"
    )
