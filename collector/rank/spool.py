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

The directory is private (``ensure_private``): made 0700, its files 0600, and checked before every
use to be a real directory (no symlink) owned by this user; a directory another user made first,
or a symlink, is refused with ``UnsafeSpoolDir`` naming it and RANKSCOPE_SPOOL_DIR (the client then
keeps its records in memory, bounded, and says so once). Otherwise another local user could read
every spooled record, delete them, or plant files that the next rank resends as its own. Only
files owned by this user are resent, and only to the endpoint the file names (a file of the first
format, ``RSSPOOL1``, names none and is never resent).

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
import stat
import struct
import tempfile
from pathlib import Path

from google.protobuf.message import DecodeError

from collector.data import processes
from proto import pb

MAGIC = b"RSSPOOL2"
_MAGIC_V1 = b"RSSPOOL1"  # no endpoint header
_MAX_ENDPOINT_BYTES = 4096  # a longer endpoint header means a damaged file, not an address
SUFFIX = ".rsspool"
_LEN = struct.Struct("<I")


class SpoolError(ValueError):
    """A spool file that is not one, or is cut short; the message names the file."""


class UnsafeSpoolDir(OSError):
    """The spool directory is not private to this user; the message names it and the way out."""


_OWN_FILE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def ensure_private(directory: Path) -> Path:
    """Make ``directory`` (0700, parents as needed) or check it: a real directory, not a symlink,
    owned by this user; one of ours left group- or world-accessible (by a rankscope before this
    check) is made 0700. Raises UnsafeSpoolDir otherwise, naming the path and RANKSCOPE_SPOOL_DIR."""
    directory = Path(directory)
    if not directory.is_symlink():
        directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
    st = os.lstat(directory)
    way_out = "set RANKSCOPE_SPOOL_DIR (or telemetry.spool_dir) to a directory of your own"
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeSpoolDir(f"spool directory {directory} is a symbolic link; refusing to spool through it: {way_out}")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeSpoolDir(f"spool directory {directory} is not a directory: {way_out}")
    me = os.geteuid()
    if st.st_uid != me:
        raise UnsafeSpoolDir(
            f"spool directory {directory} belongs to {_user_name(st.st_uid)}, not to you ({_user_name(me)}): "
            f"another user could read or plant spooled telemetry there; refusing it: {way_out}"
        )
    if st.st_mode & 0o077:
        os.chmod(directory, 0o700)
    return directory


def _user_name(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def _owned_file(path: Path) -> bool:
    """A regular file of this user (not a link, not someone else's plant)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def _create(path: Path):
    """``path`` opened for writing, 0600, never through a symlink."""
    return os.fdopen(os.open(path, _OWN_FILE, 0o600), "wb")


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
    ensure_private(directory)
    name = f"{client_id}-{envelopes[0].seq:012d}-{envelopes[-1].seq:012d}{SUFFIX}"
    path = directory / name
    tmp = directory / (name + ".tmp")
    try:
        with _create(tmp) as f:
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
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half file taking what space there is
        raise
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
    fd = os.open(side, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "ab") as f:
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
    with _create(tmp) as f:
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
    return claim_host == host and pid.isdigit() and not processes.alive(int(pid))


def local_host_id() -> str:
    """This host's name as it appears in client ids."""
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())


def orphans(directory: Path, endpoint: str | None = None) -> dict[str, list[Path]]:
    """Spool files of this user's writers on this host that no longer run, by client_id; with
    ``endpoint``, only those that name it as where they were meant to go. Raises UnsafeSpoolDir
    for a directory that is not private to this user."""
    if not directory.exists() and not directory.is_symlink():
        return {}
    ensure_private(directory)
    host = local_host_id()
    for tmp in directory.glob(f"*{SUFFIX}.tmp"):  # a writer killed mid-write: never a spool file, never resent
        owner_host, pid, _ = ([*client_id_of(tmp).rsplit(".", 2), "", ""])[:3]
        if owner_host == host and pid.isdigit() and not processes.alive(int(pid)) and _owned_file(tmp):
            tmp.unlink(missing_ok=True)
    out: dict[str, list[Path]] = {}
    abandoned = (
        [p for p in directory.glob(f"*{SUFFIX}{CLAIM_MARK}*") if _claimer_gone(p, host)] if directory.is_dir() else []
    )
    for path in sorted(files(directory) + abandoned, key=unclaimed_name):
        cid = client_id_of(path)
        owner_host, pid, _ = ([*cid.rsplit(".", 2), "", ""])[:3]
        if owner_host != host or not pid.isdigit() or processes.alive(int(pid)) or not _owned_file(path):
            continue
        if endpoint is not None:
            try:
                target = endpoint_of(path)
            except (OSError, SpoolError):
                target = endpoint  # damaged: the resend sets it aside and says what is wrong with it
            if target != endpoint:  # another collector's, or (RSSPOOL1) nobody knows whose
                continue
        out.setdefault(cid, []).append(path)
    return out
