"""Envelopes kept on local disk while the collector cannot take them.

File format (``*.rsspool``): the 8-byte magic ``RSSPOOL2``, the endpoint the
envelopes were meant for (4-byte little-endian length, UTF-8), then records of
a 4-byte little-endian length followed by that many bytes of a serialised
``rankscope.v1.Envelope``. (``RSSPOOL1`` files, written before the endpoint was
recorded, are still read; their endpoint is unknown.) Envelopes keep their
client_id and seq, so whoever resends a file (this process after a reconnect,
or a later reader of the spool directory) gets them deduplicated by the
collector.

Name: ``<client_id>-<first seq>-<last seq>.rsspool``, zero-padded so names sort
in send order; client_id is ``<host>.<pid>.<random>`` with no '-'. A file whose
writer (same host, that pid) is gone is an orphan: a client resends orphans when
it next reaches the collector they were meant for (collector.rank.resend's
``resend_spooled``); a run never lands in another collector's data dir just
because its spool shares the directory. Files are written under a ``.tmp`` name,
fsync'd and renamed, so a reader never sees half a file; they are deleted once
every envelope in them is acknowledged.

Several processes may find the same orphan at once (every rank of a new job on
the host reaches the collector at about the same moment), so an orphan is
*claimed* before it is read: renamed to ``<name>.claimed-<host>.<pid>``, which
exactly one process can do. The claimer deletes it once delivered, or renames it
back if delivery failed; a claim whose claimer died is an orphan again.
"""

from __future__ import annotations

import getpass
import os
import re
import socket
import struct
import tempfile
from pathlib import Path

from google.protobuf.message import DecodeError

from proto import pb

MAGIC = b"RSSPOOL2"
_MAGIC_V1 = b"RSSPOOL1"  # no endpoint header
_MAX_ENDPOINT_BYTES = 4096  # a longer endpoint header means a damaged file, not an address
SUFFIX = ".rsspool"
_LEN = struct.Struct("<I")


class SpoolError(ValueError):
    """A spool file that is not one, or is cut short; the message names the file."""


def default_dir() -> Path:
    """RANKSCOPE_SPOOL_DIR, else a per-user directory under the system temp dir."""
    env = os.environ.get("RANKSCOPE_SPOOL_DIR")
    if env:
        return Path(env)
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (containers): fall back to the uid
        user = str(os.getuid())
    return Path(tempfile.gettempdir()) / f"rankscope-spool-{re.sub(r'[^A-Za-z0-9_.-]', '_', user)}"


def write(directory: Path, client_id: str, envelopes: list[pb.Envelope], endpoint: str = "") -> Path:
    """One file holding ``envelopes`` (at least one) meant for ``endpoint``, made visible atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    name = f"{client_id}-{envelopes[0].seq:012d}-{envelopes[-1].seq:012d}{SUFFIX}"
    path = directory / name
    tmp = directory / (name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(MAGIC)
        target = endpoint.encode()
        f.write(_LEN.pack(len(target)) + target)
        for env in envelopes:
            data = env.SerializeToString()
            f.write(_LEN.pack(len(data)))
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def read(path: Path) -> list[pb.Envelope]:
    """Every envelope of the file; SpoolError (naming the file and the byte) for a damaged one."""
    envelopes, bad = scan(path)
    if bad:
        raise SpoolError(f"{path}: {bad[0][1]}")
    return envelopes


def scan(path: Path) -> tuple[list[pb.Envelope], list[tuple[bytes, str]]]:
    """The file's envelopes that decode, and the records that do not, as (raw bytes, what is wrong):
    one damaged record costs only itself. A file that is not a spool file at all (bad magic or
    endpoint header) raises SpoolError; a cut-short tail is one bad record."""
    with open(path, "rb") as f:
        data = f.read()
    at = _records_start(path, data)
    out: list[pb.Envelope] = []
    bad: list[tuple[bytes, str]] = []
    while at < len(data):
        if at + _LEN.size > len(data):
            bad.append((data[at:], f"truncated length prefix at byte {at}"))
            break
        (n,) = _LEN.unpack_from(data, at)
        at += _LEN.size
        if at + n > len(data):
            bad.append((data[at:], f"record at byte {at} needs {n} bytes, file ends first"))
            break
        env = pb.Envelope()
        try:
            env.ParseFromString(data[at : at + n])
        except DecodeError as e:
            bad.append((data[at : at + n], f"record at byte {at} ({n} bytes) is no Envelope: {e}"))
        else:
            out.append(env)
        at += n
    return out, bad


QUARANTINE_SUFFIX = ".quarantined"


def quarantine(path: Path, records: list[bytes], endpoint: str = "") -> Path:
    """Sets ``records`` (raw, as they were in the spool file ``path``) aside in a side file beside it,
    ``<spool file name>.quarantined``, in the spool format (``scan`` reads it back), appended to
    when the same file sets more aside. It is never resent (its name does not end in ``.rsspool``)
    and never deleted by rankscope: it is kept for inspection."""
    side = path.with_name(unclaimed_name(path) + QUARANTINE_SUFFIX)
    new = not side.exists()
    with open(side, "ab") as f:
        if new:
            target = endpoint.encode()
            f.write(MAGIC + _LEN.pack(len(target)) + target)
        for data in records:
            f.write(_LEN.pack(len(data)) + data)
        f.flush()
        os.fsync(f.fileno())
    return side


def rewrite(path: Path, envelopes: list[pb.Envelope], endpoint: str) -> None:
    """Replaces the (claimed) file ``path`` by one holding only ``envelopes``, atomically: what was
    set aside or delivered is not sent again by whoever takes the file next."""
    tmp = path.with_name(unclaimed_name(path) + ".rewrite-tmp")  # neither a spool file nor a claim
    with open(tmp, "wb") as f:
        target = endpoint.encode()
        f.write(MAGIC + _LEN.pack(len(target)) + target)
        for env in envelopes:
            data = env.SerializeToString()
            f.write(_LEN.pack(len(data)) + data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def endpoint_of(path: Path) -> str | None:
    """The endpoint the file's envelopes were meant for; None if the file does not say."""
    with open(path, "rb") as f:
        head = f.read(len(MAGIC) + _LEN.size + _MAX_ENDPOINT_BYTES)
    if head.startswith(_MAGIC_V1):
        return None
    at = _records_start(path, head)
    return head[len(MAGIC) + _LEN.size : at].decode("utf-8", "replace")


def _records_start(path: Path, data: bytes) -> int:
    """Offset of the first record, after the magic and (v2) the endpoint."""
    if data.startswith(_MAGIC_V1):
        return len(_MAGIC_V1)
    if not data.startswith(MAGIC):
        raise SpoolError(f"{path}: not a rankscope spool file (bad magic)")
    if len(data) < len(MAGIC) + _LEN.size:
        raise SpoolError(f"{path}: truncated endpoint header")
    (n,) = _LEN.unpack_from(data, len(MAGIC))
    if n > _MAX_ENDPOINT_BYTES or len(data) < len(MAGIC) + _LEN.size + n:
        raise SpoolError(f"{path}: endpoint header of {n} bytes is cut short or implausible")
    return len(MAGIC) + _LEN.size + n


def files(directory: Path, client_id: str | None = None) -> list[Path]:
    """Spool files in send order, all of them or one client's."""
    if not directory.is_dir():
        return []
    prefix = f"{client_id}-" if client_id else ""
    return sorted(p for p in directory.iterdir() if p.name.endswith(SUFFIX) and p.name.startswith(prefix))


CLAIM_MARK = ".claimed-"


def client_id_of(path: Path) -> str:
    return unclaimed_name(path).rsplit("-", 2)[0]


def unclaimed_name(path: Path) -> str:
    """The spool file's own name, without a claim suffix."""
    return path.name.split(CLAIM_MARK, 1)[0]


def claim(path: Path) -> Path | None:
    """Take ``path`` (an orphan, or an abandoned claim) for this process; None if another took it first."""
    claimed = path.with_name(f"{unclaimed_name(path)}{CLAIM_MARK}{local_host_id()}.{os.getpid()}")
    try:
        os.rename(path, claimed)
    except FileNotFoundError:
        return None
    return claimed


def release(claimed: Path) -> None:
    """Give a claimed file back (delivery failed): it is an ordinary orphan again."""
    try:
        os.rename(claimed, claimed.with_name(unclaimed_name(claimed)))
    except FileNotFoundError:
        pass


def _claimer_gone(path: Path, host: str) -> bool:
    claimer = path.name.split(CLAIM_MARK, 1)[1]
    claim_host, _, pid = claimer.rpartition(".")
    return claim_host == host and pid.isdigit() and not _pid_alive(int(pid))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def local_host_id() -> str:
    """This host's name as it appears in client ids."""
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())


def orphans(directory: Path, endpoint: str | None = None) -> dict[str, list[Path]]:
    """Spool files of writers on this host that no longer run, by client_id; with
    ``endpoint``, only those meant for it (or not saying which collector they were for)."""
    host = local_host_id()
    out: dict[str, list[Path]] = {}
    abandoned = (
        [p for p in directory.glob(f"*{SUFFIX}{CLAIM_MARK}*") if _claimer_gone(p, host)] if directory.is_dir() else []
    )
    for path in sorted(files(directory) + abandoned, key=unclaimed_name):
        cid = client_id_of(path)
        owner_host, pid, _ = ([*cid.rsplit(".", 2), "", ""])[:3]
        if owner_host != host or not pid.isdigit() or _pid_alive(int(pid)):
            continue
        if endpoint is not None:
            try:
                target = endpoint_of(path)
            except (OSError, SpoolError):
                target = None  # let the resend report what is wrong with it
            if target not in (None, endpoint):
                continue
        out.setdefault(cid, []).append(path)
    return out
