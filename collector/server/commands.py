"""Commands from the collector to ranks of a live run: profile the next steps, capture stacks,
report memory.

A command is a ``pb.RankRequest`` with an id, sent on the Acks of each asked rank's stream (the
way liveness asks for stacks), so it reaches a rank only through the authenticated stream that
rank opened: nothing listens on a rank. Who may ask: ``rankscope profile``/``stacks`` through
the ``Command`` RPC (refused without the collector's token like every RPC), and the collector's
own escalation (collector.server.escalation). The rank answers with ``artifacts`` rows (accepted,
refused with a reason, failed) and, for a capture, an ``Artifact`` envelope
(collector.rank.capture, collector.server.artifacts).

Bounds: ``kind`` one of KINDS, ``steps`` 1..MAX_PROFILE_STEPS for a profile, at most
MAX_RANKS_PER_COMMAND ranks at once; anything else is a ValueError naming it (the RPC answers
INVALID_ARGUMENT). A rank with no stream open here is named in the reply's ``refused``.
"""

from __future__ import annotations

import collections
import secrets
import threading
import time

from collector.data.codec import CodecError, check_run_id
from collector.server.artifacts import REQUEST_ID_RE
from proto import pb

KINDS = ("profile", "stacks", "memory")
MAX_PROFILE_STEPS = 20  # collector.rank.capture.MAX_STEPS: the rank refuses more
MAX_RANKS_PER_COMMAND = 64
MAX_TEXT_CHARS = 2000
SENT_KEPT = 10_000  # commands remembered for ``sent`` (tests, benchmarks, the escalation's limits)


def new_request_id(kind: str) -> str:
    return f"{kind}-{time.strftime('%H%M%S', time.gmtime())}-{secrets.token_hex(4)}"


class Commands:
    def __init__(self, liveness) -> None:
        self.liveness = liveness
        self._lock = threading.Lock()
        self.sent: collections.deque = collections.deque(maxlen=SENT_KEPT)  # (monotonic, run_id, rank, kind, role, id)

    def send(self, run_id: str, ranks, request: pb.RankRequest, roles: dict[int, str] | None = None) -> pb.CommandReply:
        """Send ``request`` (given an id here) to each of ``ranks`` of ``run_id`` streaming here;
        ``roles`` names a rank's role (suspect / reference) in its copy, ``asked`` otherwise."""
        ranks = list(dict.fromkeys(int(r) for r in ranks))
        check(run_id, ranks, request)
        given, request = request, pb.RankRequest()
        request.CopyFrom(given)
        request.id = given.id or new_request_id(given.kind)
        reply = pb.CommandReply(request_id=request.id)
        streams = self.liveness.streams_of(run_id)
        for rank in ranks:
            if rank not in streams:
                reply.refused.append(f"rank {rank}: no stream of run {run_id!r} open on this collector")
                continue
            mine = pb.RankRequest()
            mine.CopyFrom(request)
            mine.role = (roles or {}).get(rank) or request.role or "asked"
            streams[rank][0].request(mine)
            reply.sent.append(rank)
            with self._lock:
                self.sent.append((time.monotonic(), run_id, rank, request.kind, mine.role, request.id))
        return reply


def check(run_id: str, ranks: list[int], request: pb.RankRequest) -> None:
    """ValueError naming what is out of bounds in a command."""
    try:
        check_run_id(run_id)
    except CodecError as exc:
        raise ValueError(str(exc)) from None
    if request.kind not in KINDS:
        raise ValueError(f"kind {request.kind[:40]!r} is not one of {', '.join(KINDS)}")
    if not ranks:
        raise ValueError("no ranks named")
    if len(ranks) > MAX_RANKS_PER_COMMAND:
        raise ValueError(f"{len(ranks)} ranks named; at most {MAX_RANKS_PER_COMMAND} per command")
    if any(r < 0 for r in ranks):
        raise ValueError(f"rank {min(ranks)} is negative")
    if request.kind == "profile" and not 1 <= request.steps <= MAX_PROFILE_STEPS:
        raise ValueError(f"steps {request.steps} is outside 1..{MAX_PROFILE_STEPS}")
    if request.id and not REQUEST_ID_RE.match(request.id):
        raise ValueError(f"request id {request.id[:80]!r} is not 1-64 of [A-Za-z0-9_-]")
    for name in ("reason", "finding", "role"):
        if len(getattr(request, name)) > MAX_TEXT_CHARS:
            raise ValueError(f"{name} is over {MAX_TEXT_CHARS} characters")
