"""The collector's side of requests left in its data dir (collector.data.requests: the dashboard's
"profile now"): a thread looks in D/requests every ``interval_s``, and for each file

* checks it (RequestError: logged, and the file removed -- a request that cannot be carried out
  now never can);
* sends it through the command path (collector.server.commands) to the named ranks streaming
  here, with a reference rank for a profile that names none (collector.server.escalation.
  pick_reference: on the first rank's host, then the lowest other rank streaming);
* stores a ``refused`` ``artifacts`` row for each named rank not streaming here (the ranks that
  got it answer accepted / refused / captured themselves, as to any command), so the page that
  asked shows what became of it;
* removes the file.

With several collectors sharing D (``--writer-id``) each carries out the requests for runs
streaming to it and leaves the others' files; a file no collector takes is removed after
``max_age_s``. Never raises into the collector: a request is evidence asked for, not intake.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
import time

import pyarrow as pa

from collector.data import requests
from collector.data.schema import TABLES
from proto import pb

log = logging.getLogger("rankscope.requests")

INTERVAL_S = 1.0
MAX_AGE_S = 120.0


class RequestFiles:
    def __init__(self, state, *, interval_s: float = INTERVAL_S, max_age_s: float = MAX_AGE_S) -> None:
        self.state = state
        self.interval_s, self.max_age_s = interval_s, max_age_s
        self.handled: list[tuple[str, str]] = []  # (request id, what became of it), for tests and logs
        self._client_id = f"rankscope-requests.{secrets.token_hex(6)}"  # its refusals' rows, to the store
        self._seq = itertools.count(1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rankscope-requests", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception:  # never the collector's problem
                log.exception("requests: a pass over %s failed", requests.folder(self.state.data_dir))

    def poll(self) -> int:
        """Carry out the request files waiting; how many were handled."""
        done = 0
        for path in requests.pending(self.state.data_dir):
            try:
                request = requests.read(path)
            except requests.RequestError as exc:
                log.warning("requests: %s; removed", exc)
                self._remove(path, path.stem, f"refused: {exc}")
                done += 1
                continue
            streams = self.state.liveness.streams_of(request["run_id"])
            if not streams and self.state.store.ledger.writer is not None:
                if time.time() - float(request.get("asked_at", 0)) > self.max_age_s:
                    self._remove(path, request["request_id"], f"no collector took it within {self.max_age_s:.0f} s")
                    done += 1
                continue  # another collector sharing D may hold the run
            self._carry_out(request, streams)
            self._remove(path, request["request_id"], "sent")
            done += 1
        return done

    def _carry_out(self, request: dict, streams: dict) -> None:
        ranks = list(dict.fromkeys(request["ranks"]))
        roles = dict.fromkeys(ranks, "suspect" if request["kind"] == "profile" else "asked")
        reference = request.get("reference")
        if request["kind"] == "profile" and reference is None and ranks[0] in streams:
            from collector.server.escalation import pick_reference  # pandas: only when a profile is asked for

            reference = pick_reference(streams, set(ranks), ranks[0], None)
        if reference is not None:
            roles[reference] = "reference"
        if request["kind"] == "profile" and reference is None:
            roles = dict.fromkeys(ranks, "asked")  # nothing to compare with: traces alone
        command = pb.RankRequest(
            id=request["request_id"],
            kind=request["kind"],
            steps=request["steps"],
            with_stack=request["kind"] == "profile",
            reason=f"asked from the dashboard by {request.get('who') or 'someone'}"[:2000],
        )
        try:
            reply = self.state.commands.send(request["run_id"], list(roles), command, roles=roles)
        except ValueError as exc:
            refused = {rank: f"refused by the collector: {exc}" for rank in roles}
        else:
            refused = {rank: text for rank, text in zip(_refused_ranks(reply, roles), reply.refused, strict=True)}
        if refused:
            self._store_refusals(request, roles, refused)

    def _store_refusals(self, request: dict, roles: dict[int, str], refused: dict[int, str]) -> None:
        schema = TABLES["artifacts"].arrow_schema()
        now = time.time_ns()
        rows = [
            {
                "rank": rank,
                "step": 0,
                "request_id": request["request_id"],
                "kind": request["kind"],
                "status": "refused",
                "steps": request["steps"],
                "last_step": 0,
                "path": "",
                "bytes": 0,
                "reason": f"asked from the dashboard by {request.get('who') or 'someone'}"[:2000],
                "finding": "",
                "role": roles[rank],
                "detail": detail[:2000],
                "time_ns": now,
            }
            for rank, detail in refused.items()
        ]
        table = pa.table({n: pa.array([r[n] for r in rows], schema.field(n).type) for n in schema.names}, schema=schema)
        rows = [("artifacts", request["run_id"], table)]
        self.state.store.submit(self._client_id, next(self._seq), rows, lambda error: None)

    def _remove(self, path, request_id: str, outcome: str) -> None:
        path.unlink(missing_ok=True)
        self.handled.append((request_id, outcome))


def _refused_ranks(reply: pb.CommandReply, roles: dict[int, str]) -> list[int]:
    """The ranks of ``roles`` the reply did not send to, in the order its ``refused`` names them."""
    sent = set(reply.sent)
    return [rank for rank in roles if rank not in sent]
