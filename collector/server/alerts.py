"""``rankscope collect --alert-webhook URL``: each new finding, posted once, rate-limited.

A finding is new the first time its (run, kind, severity, ranks) is seen: the sentence of a
straggler finding changes as its numbers move ("98%", then "99%"), and that is the same
finding, not a new alert. A finding that gets worse (warning to critical) or moves to other
ranks is new. A stuck or hung collective is an incident of its own (its group and seq are part of
the key): the next collective the same rank holds up is alerted too. Checks that passed (severity
``ok``) are not alerts.

The body is JSON with a Slack-compatible ``text`` (incoming webhooks of Slack, Mattermost and
Discord's /slack endpoint show it as is) and the finding itself (``Finding.to_json``) under
``finding`` for anything that parses it, with ``run_id`` and ``run`` (the run's name).

Posting happens on a thread of its own, at most one post per ``min_interval_s``; findings wait
in a bounded queue (beyond ``max_queued`` the oldest are dropped and counted). A failing or
slow webhook (5 s timeout, one retry) is logged and never touches ingest or the metrics.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import urlparse

from collector.data.findings import Finding

log = logging.getLogger("rankscope.alerts")

POST_TIMEOUT_S = 5.0
PER_COLLECTIVE = ("stuck", "hang")  # kinds told of one collective instance (evidence group_name, seq)


def check_url(url: str) -> str:
    """The webhook URL, or ValueError naming what is wrong with it."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"--alert-webhook: {url!r} is not an http(s) URL")
    return url


def _collective(finding: Finding) -> tuple | None:
    """The collective instance a stuck or hang finding tells of; None for other kinds."""
    if finding.kind not in PER_COLLECTIVE:
        return None
    return finding.evidence.get("group_name"), finding.evidence.get("seq")


class AlertWebhook:
    def __init__(self, url: str, *, min_interval_s: float = 2.0, max_queued: int = 1000) -> None:
        self.url = check_url(url)
        self.min_interval_s = min_interval_s
        self._seen: set[tuple] = set()
        self._queue: collections.deque = collections.deque(maxlen=max_queued)
        self._wake = threading.Condition()
        self._stopping = False
        self.posted = 0
        self.failed = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="rankscope-alerts", daemon=True)
        self._thread.start()

    def offer(self, run_id: str, run_name: str, findings: list[Finding]) -> int:
        """Queue the findings not posted before; returns how many were new."""
        new = 0
        with self._wake:
            for finding in findings:
                key = (run_id, finding.kind, finding.severity, tuple(finding.ranks), _collective(finding))
                if finding.severity == "ok" or key in self._seen:
                    continue
                self._seen.add(key)
                if len(self._queue) == self._queue.maxlen:
                    self.dropped += 1
                self._queue.append(self._body(run_id, run_name, finding))
                new += 1
            if new:
                self._wake.notify()
        return new

    @staticmethod
    def _body(run_id: str, run_name: str, finding: Finding) -> bytes:
        text = f"rankscope [{finding.severity}] {run_name} ({run_id}): {finding.text}"
        return json.dumps({"text": text, "run_id": run_id, "run": run_name, "finding": finding.to_json()}).encode()

    def _run(self) -> None:
        last_post = float("-inf")
        while True:
            with self._wake:
                while not self._queue and not self._stopping:
                    self._wake.wait()
                if self._stopping and not self._queue:
                    return
                body = self._queue.popleft()
            pause = last_post + self.min_interval_s - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            last_post = time.monotonic()
            self._post(body)

    def _post(self, body: bytes) -> None:
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        for attempt in (1, 2):
            try:
                with urllib.request.urlopen(request, timeout=POST_TIMEOUT_S) as reply:
                    reply.read()
                self.posted += 1
                return
            except (urllib.error.URLError, OSError) as exc:
                if attempt == 2:
                    self.failed += 1
                    log.warning("rankscope: alert webhook %s failed: %s", self.url, exc)

    def close(self, wait_s: float = 5.0) -> None:
        """Post what is queued (up to ``wait_s``), then stop."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(wait_s)
