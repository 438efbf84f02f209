"""Delivering spool files whose writers are gone (orphans, collector.rank.spool) to the
collector they were meant for: a client calls ``resend_spooled`` on its own thread
("rankscope-orphans") once it first reaches its collector.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from collector.data import security
from collector.data.codec import RESEND_KEY
from collector.rank import spool
from collector.rank.stream import rejected_seq
from proto import pb, pb_grpc

log = logging.getLogger("rankscope.client")


def resend_spooled(
    directory: Path, endpoint: str, token: str | None = None, timeout_s: float = 60.0, tls_ca: str | None = None
) -> tuple[int, int]:
    """Stream the orphaned spool files meant for ``endpoint`` (writers on this host
    that are gone) to it, one writer (client_id) per stream so acks are
    unambiguous, deleting each file once all its envelopes are acked. Each file is
    claimed first (spool.claim), so processes racing for the same orphans never
    send one twice, and a file another process took is skipped without a word.

    A record that cannot be delivered costs only itself: one that does not decode, or an
    envelope the collector refuses (INVALID_ARGUMENT naming its seq), is set aside in the
    file's side file (spool.quarantine: kept for inspection, never resent), counted and
    logged once per file, and the rest of the file is still delivered, each envelope once
    (the collector acks a resend of a durable one without storing it again). One writer's
    failure never stops the others. Says in one line what it resent, for which runs, to
    where. Returns (files delivered, files left). Never raises."""
    try:
        return _resend_spooled(Path(directory), endpoint, token, timeout_s, tls_ca)
    except Exception:
        log.exception("rankscope: resending the spool files in %s failed", directory)
        return 0, 0


class _Refused(Exception):
    """The collector refuses resent spool files (rankscope collect --no-resends)."""


@dataclass
class _Resent:
    delivered: int = 0
    left: int = 0
    records: int = 0
    quarantined: int = 0
    runs: set = field(default_factory=set)


def _resend_spooled(directory: Path, endpoint: str, token, timeout_s: float, tls_ca) -> tuple[int, int]:
    try:
        groups = spool.orphans(directory, endpoint)
    except spool.UnsafeSpoolDir as e:
        log.error("rankscope: not resending earlier spool files: %s", e)
        return 0, 0
    if not groups:
        return 0, 0
    # marked as a resend: the collector reports what earlier runs it got this way, or refuses them
    metadata = [*(security.auth_metadata(token) or []), (RESEND_KEY, "spool")]
    try:
        channel = security.open_channel(endpoint, tls_ca=tls_ca)
    except security.SecurityConfigError as e:
        log.error("rankscope: cannot resend spool files: %s", e)
        return 0, sum(len(paths) for paths in groups.values())
    tally = _Resent()
    with channel:
        stub = pb_grpc.CollectorStub(channel)
        for client_id, paths in groups.items():
            claimed = [c for c in (spool.claim(p) for p in paths) if c is not None]  # None: another process has it
            if not claimed:
                continue
            try:
                _resend_files(stub, metadata, timeout_s, client_id, claimed, endpoint, tally)
            except _Refused as e:
                log.warning(
                    "rankscope: the collector at %s takes no resends (%s); the spool files stay in %s",
                    endpoint,
                    e,
                    directory,
                )
                for path in claimed:
                    spool.release(path)
                tally.left = sum(len(p) for p in groups.values()) - tally.delivered
                break
            except Exception:  # a bug or a disk error on one writer's files: the others still go
                log.exception("rankscope: resending the spool files of %s failed", client_id)
                for path in claimed:
                    if path.exists():
                        spool.release(path)
                        tally.left += 1
    if tally.delivered:
        log.warning(
            "rankscope: resent %d record(s) of %d earlier run(s) spooled for this endpoint (%s), left in %s by "
            "processes that have exited, to the collector at %s%s",
            tally.records,
            len(tally.runs),
            ", ".join(sorted(tally.runs)) or "?",
            directory,
            endpoint,
            f"; {tally.quarantined} record(s) set aside in *{spool.QUARANTINE_SUFFIX}" if tally.quarantined else "",
        )
    return tally.delivered, tally.left


def _resend_files(stub, metadata, timeout_s: float, client_id: str, claimed: list[Path], endpoint: str, tally) -> None:
    """One writer's claimed files, on as many streams as refusals need (see resend_spooled)."""
    per_file: dict[Path, list[pb.Envelope]] = {}
    aside: dict[Path, list[bytes]] = {}
    why: dict[Path, list[str]] = {}
    for path in claimed:
        try:
            got, bad = spool.scan(path)
        except spool.SpoolError as e:  # not a spool file at all: set the whole file aside
            got, bad = [], [(path.read_bytes(), str(e))]
        if bad:
            aside[path] = [raw for raw, _ in bad]
            why[path] = [f"{len(bad)} undecodable ({bad[0][1]})"]
        per_file[path] = got
    envs = [env for got in per_file.values() for env in got]
    file_of = {env.seq: path for path, got in per_file.items() for env in got}
    acked: set[int] = set()
    refused: dict[int, str] = {}
    for _ in range(len(envs) + 1):  # a stream ends at each refusal: at most one per envelope, plus the last
        to_send = [env for env in envs if env.seq not in acked and env.seq not in refused]
        if not to_send:
            break
        need = {env.seq for env in to_send}
        call = stub.Stream(iter(to_send), metadata=metadata, timeout=timeout_s)
        try:
            for ack in call:
                acked.update(ack.seqs)
                if need <= acked:
                    break
        except grpc.RpcError as e:
            detail = e.details() if hasattr(e, "details") else str(e)
            if getattr(e, "code", lambda: None)() == grpc.StatusCode.FAILED_PRECONDITION and not acked:
                raise _Refused(detail) from None
            seq = rejected_seq(e) if getattr(e, "code", lambda: None)() == grpc.StatusCode.INVALID_ARGUMENT else None
            if seq in file_of and seq not in acked and seq not in refused:
                refused[seq] = detail  # set it aside; the rest goes again on a new stream
                continue
            log.warning("rankscope: resending spool of %s stopped: %s", client_id, detail)
            break
        finally:
            call.cancel()
        if not need <= acked:
            break  # the stream ended without an error and without every ack: try another time
    for seq, detail in refused.items():
        path = file_of[seq]
        aside.setdefault(path, [])
        why.setdefault(path, [])
        env = next(env for env in per_file[path] if env.seq == seq)
        aside[path].append(env.SerializeToString())
        why[path].append(f"seq {seq} refused by the collector: {detail}")
    for path, got in per_file.items():
        if path in aside:
            side = spool.quarantine(path, aside[path], endpoint)
            tally.quarantined += len(aside[path])
            log.error(
                "rankscope: set aside %d record(s) of spool file %s that cannot be delivered (%s); they are kept "
                "in %s, the file's other records are delivered",
                len(aside[path]),
                spool.unclaimed_name(path),
                "; ".join(why[path]),
                side,
            )
        rest = [env for env in got if env.seq not in acked and env.seq not in refused]
        if not rest:
            path.unlink(missing_ok=True)
            tally.delivered += 1
        else:
            if len(rest) < len(got) or path in aside:  # whoever takes it next sends only what is left
                spool.rewrite(path, rest, endpoint)
            spool.release(path)
            tally.left += 1
        for env in got:
            if env.seq in acked:
                body = env.WhichOneof("body")
                if body == "table":
                    tally.records += env.table.rows
                    tally.runs.add(env.table.run_id)
                elif body in ("hello", "end"):
                    tally.runs.add(getattr(env, body).run_id)
