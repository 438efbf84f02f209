"""The store's commit log: which segments are committed and which envelopes are durable.

Every flush and every compaction is one commit, made in this order:

1. new segment files are written under temporary names (``layout.temp_name``),
   which the catalog's globs never match, and fsync'd;
2. a ledger record naming the files (and, for a flush, the (client_id, seq) of
   every envelope in it) is appended to ``D/ledger/log-<gen>.jsonl`` and fsync'd
   -- this is the commit point;
3. the files are renamed into place (a compaction first unlinks its inputs) and
   the directories fsync'd; only then are envelopes acknowledged.

After a crash (SIGKILL included) ``Ledger(D)`` replays the log: committed files
still under temporary names are renamed (rolled forward), compaction inputs still
present are unlinked, and temporary files no record names are deleted, so every
row is in exactly one visible segment. The dedupe state -- per client, the seqs
already durable -- is rebuilt from the same records; a resent envelope is acked
again without being written twice.

Readers see snapshots. Listing the partition folders cannot give one: a flush renames several
files and a compaction swaps several, one by one, so a reader listing them mid-commit would miss
rows or count them twice, and a file it listed may be gone by the time it opens it. So after each
commit the ledger publishes ``manifest.json`` in its folder (written aside, then renamed: readers
see the old list or the new one): per table, the files readers take. A committed segment is
listed by a hard link ``D/snapshot/<table>/run=<id>/<name>`` made to it at commit time; when a
compaction (or retention, or quarantine) retires a segment, its partition name goes at once (so
the partition folders keep meaning "the live segments" for every tool that lists them) while its
link stays ``DELETE_AFTER_S`` (longer than any read: user queries stop at 30 s) after the
manifest stopped naming it, so a reader that read the previous manifest still finds every file.
A read slower than that fails to open a file and is run again on the new manifest
(``catalog.with_segment_retry``). Files no writer named (put there by hand or by git) are listed
as they are (found at start-up and by the compactor as partitions change). A filesystem without
hard links gets the partition paths in the manifest (consistent lists, but a slow reader may
need the retry). Data dirs without a manifest are read by listing, as before
(collector.data.catalog). After a crash the links of segments no longer committed are retired
at start-up, after the new manifest is published.

The log is compacted into ``checkpoint-<gen>.json`` (just the dedupe state and
the commit counter) at start-up and every ``CHECKPOINT_EVERY`` records. Each log
line is ``<crc32 hex> <json>``; a torn last line (crash mid-append) fails its
checksum and is cut off, as that commit never happened.
"""

from __future__ import annotations

import bisect
import fcntl
import json
import logging
import math
import os
import threading
import time
import zlib
from collections.abc import Iterable
from pathlib import Path

from collector.data import layout

log = logging.getLogger(__name__)

CHECKPOINT_EVERY = 2000
DELETE_AFTER_S = 60.0  # a retired segment's snapshot link outlives the last manifest naming it this long


class DataDirBusy(RuntimeError):
    """Another collector process owns this data dir."""


class LedgerBroken(RuntimeError):
    """The log could not be repaired after a failed write; only a restart recovers."""


class SeqSet:
    """The seqs of one client that are durable, as sorted disjoint [lo, hi] ranges.

    Clients number envelopes 1, 2, 3...; normally this is the single range
    [1, n]. Resends arrive out of order and a client may skip a seq for good
    (an envelope the collector refused), so a gap costs one more range, never
    one entry per later seq."""

    __slots__ = ("ranges",)

    def __init__(self, ranges: Iterable[Iterable[int]] = ()):
        self.ranges: list[list[int]] = []
        for lo, hi in ranges:
            self.add_range(lo, hi)

    def __contains__(self, seq: int) -> bool:
        i = bisect.bisect_right(self.ranges, [seq, math.inf]) - 1  # last range starting <= seq
        return i >= 0 and seq <= self.ranges[i][1]

    def add(self, seq: int) -> None:
        self.add_range(seq, seq)

    def add_range(self, lo: int, hi: int) -> None:
        r = self.ranges
        i = bisect.bisect_left(r, [lo])  # first range starting at or after lo
        if i > 0 and r[i - 1][1] >= lo - 1:  # the one before touches: merge from there
            i -= 1
        j = i
        while j < len(r) and r[j][0] <= hi + 1:
            lo, hi = min(lo, r[j][0]), max(hi, r[j][1])
            j += 1
        r[i:j] = [[lo, hi]]


def _ranges(seqs: Iterable[int]) -> list[list[int]]:
    """[3, 1, 2, 7] -> [[1, 3], [7, 7]]: how a record stores seqs compactly."""
    out: list[list[int]] = []
    for s in sorted(seqs):
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return out


def _hard_link(source: Path, link: Path) -> None:
    """``link`` -> the file at ``source``, creating its folder; one already there is kept if it is
    that file (made before a crash) and replaced otherwise (names are unique: only by hand)."""
    try:
        os.link(source, link)
    except FileNotFoundError:
        link.parent.mkdir(parents=True, exist_ok=True)
        os.link(source, link)
    except FileExistsError:
        if not os.path.samefile(source, link):
            link.unlink()
            os.link(source, link)


def _encode_line(record: dict) -> bytes:
    body = json.dumps(record, separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def _decode_line(line: bytes) -> dict | None:
    """The record on one log line, or None if the line is torn or corrupt."""
    if not line.endswith(b"\n") or len(line) < 10 or line[8:9] != b" ":
        return None
    body = line[9:-1]
    try:
        if int(line[:8], 16) != zlib.crc32(body):
            return None
        return json.loads(body)
    except ValueError:
        return None


class Ledger:
    """Recovers D on construction, then records commits. Thread-safe."""

    def __init__(self, data_dir: Path, writer: str | None = None):
        self.data_dir = Path(data_dir)
        self.writer = layout.check_writer(writer)  # None: the only writer of D
        self._own_name = layout.segment_name_re(writer)
        self.dir = layout.ledger_dir(self.data_dir, writer)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._owner = self._lock_data_dir()
        self._lock = threading.Lock()
        self._clients: dict[str, SeqSet] = {}
        self._next_commit = 1
        self._gen = 0
        self._records_in_log = 0
        self._broken = False
        # table -> {segment path (relative to D): the path readers take}; published as the manifest
        self._visible: dict[str, dict[str, str]] = {}
        self._foreign: dict[str, list[str]] = {}  # partition (relative) -> files no writer named
        self._retired: list[tuple[float, Path]] = []  # (monotonic time retired, snapshot link)
        self._linkable = True  # False once the filesystem refused a hard link
        self._published = False  # whether the manifest on disk is the current one
        self._recover()
        self._checkpoint()
        self._scan_visible()

    # -- queries ---------------------------------------------------------

    def is_durable(self, client_id: str, seq: int) -> bool:
        with self._lock:
            seqs = self._clients.get(client_id)
            return seqs is not None and seq in seqs

    def reserve_commit(self) -> int:
        """A fresh commit number, used to name the segments of that commit."""
        with self._lock:
            n = self._next_commit
            self._next_commit += 1
            return n

    # -- commits ---------------------------------------------------------

    def commit_segments(self, commit: int, finals: list[Path], acked: dict[str, list[int]]) -> None:
        """Commit segments already written (fsync'd) at ``layout.temp_name(final)``."""
        record = {
            "commit": commit,
            "add": [self._rel(p) for p in finals],
            "acked": {c: _ranges(s) for c, s in acked.items()},
        }
        with self._lock:
            self._append(record)
            self._show(finals)
            self._apply(record)
            self._publish()
            for client, ranges in record["acked"].items():
                seq_set = self._clients.setdefault(client, SeqSet())
                for lo, hi in ranges:
                    seq_set.add_range(lo, hi)
            self._after_commit()

    def commit_compaction(self, commit: int, inputs: list[Path], outputs: list[Path]) -> None:
        """Replace ``inputs`` by ``outputs`` (each written at its temporary name; several when the
        rows are split, none when every row was dropped): one record, so a crash leaves the old
        segments or the new ones, never both or neither."""
        record = {
            "commit": commit,
            "compact": {"inputs": [self._rel(p) for p in inputs], "outputs": [self._rel(p) for p in outputs]},
        }
        with self._lock:
            self._append(record)
            self._show(outputs)
            self._apply(record)
            retired = self._hide(inputs)
            self._publish()
            self._retire(retired)
            self._after_commit()

    def withdraw(self, segment: Path) -> None:
        """Stop showing ``segment`` to readers (it is about to be quarantined); readers that still
        hold the previous manifest keep reading its snapshot link until it is deleted."""
        with self._lock:
            retired = self._hide([segment])
            self._publish()
            self._retire(retired)

    def note_foreign(self, partition: Path, files: list[Path]) -> None:
        """The files in ``partition`` that no writer named (the compactor lists them as it goes)."""
        rel = self._rel(partition)
        names = sorted(self._rel(p) for p in files)
        with self._lock:
            if self._foreign.get(rel, []) == names:
                return
            if names:
                self._foreign[rel] = names
            else:
                self._foreign.pop(rel, None)
            self._publish()

    def collect_garbage(self, after_s: float = DELETE_AFTER_S) -> int:
        """Delete the snapshot links retired more than ``after_s`` ago; returns how many."""
        cutoff = time.monotonic() - after_s
        with self._lock:
            if not self._published:  # a stale manifest may still name them
                return 0
            due = [p for t, p in self._retired if t <= cutoff]
            self._retired = [(t, p) for t, p in self._retired if t > cutoff]
        for path in due:
            path.unlink(missing_ok=True)
        # A folded run's snapshot folders are left empty (compaction.Compactor.fold): remove them, under
        # the lock, so that no commit is linking a file into one meanwhile (``_show``).
        with self._lock:
            for folder in {path.parent for path in due}:
                try:
                    folder.rmdir()
                except OSError:
                    pass  # not empty
        return len(due)

    def visible_segments(self) -> dict[str, list[str]]:
        """What the manifest lists: table -> paths relative to D."""
        with self._lock:
            return self._manifest_tables()

    def close(self, after_s: float = DELETE_AFTER_S) -> None:
        """Release the data dir for another collector (deleting the links retired long enough ago;
        the next start retires any left)."""
        self.collect_garbage(after_s)
        self._owner.close()

    # -- internals -------------------------------------------------------

    def _show(self, segments: list[Path]) -> None:
        """Link each committed segment (still at its temporary name) into the snapshot tree and list it."""
        for seg in segments:
            rel = self._rel(seg)
            self._visible.setdefault(Path(rel).parts[1], {})[rel] = self._link(layout.temp_name(seg), seg)

    def _link(self, source: Path, segment: Path) -> str:
        """The path (relative to D) readers take for ``segment``, whose bytes are at ``source`` now."""
        if self._linkable:
            link = layout.snapshot_link(self.data_dir, segment)
            try:
                _hard_link(source, link)
                return self._rel(link)
            except OSError as exc:  # no hard links here: readers get the partition path
                log.warning("no hard link %s (%s): readers now read segments in place until a restart", link, exc)
                self._linkable = False
        return self._rel(segment)

    def _hide(self, segments: list[Path]) -> list[Path]:
        """Unlist ``segments``; returns their snapshot links, to be retired once the manifest is out."""
        links = []
        for seg in segments:
            rel = self._rel(seg)
            shown = self._visible.get(Path(rel).parts[1], {}).pop(rel, None)
            if shown is not None and shown != rel:
                links.append(self.data_dir / shown)
        return links

    def _retire(self, links: list[Path]) -> None:
        now = time.monotonic()
        self._retired.extend((now, p) for p in links)

    def _manifest_tables(self) -> dict[str, list[str]]:
        tables: dict[str, set[str]] = {t: set(v.values()) for t, v in self._visible.items()}
        for partition, names in self._foreign.items():
            tables.setdefault(Path(partition).parts[1], set()).update(names)
        return {t: sorted(v) for t, v in sorted(tables.items()) if v}

    def _publish(self) -> None:
        """Write the manifest aside and rename it into place: readers see this commit whole or not at all.
        Not fsync'd: after a crash the next start rebuilds it from the segments in place. A failure
        (disk full) does not undo the commit: readers keep the previous manifest, and no retired link
        is deleted until one is published again."""
        body = json.dumps(
            {"version": 1, "commit": self._next_commit - 1, "tables": self._manifest_tables()}, separators=(",", ":")
        )
        path = self.dir / layout.MANIFEST_FILE
        tmp = path.with_name(f".{path.name}{layout.TEMP_SUFFIX}")
        try:
            tmp.write_text(body)
            os.replace(tmp, path)
        except OSError:
            log.exception("publishing the readers' manifest failed; they read the previous commit until the next")
            self._published = False
        else:
            self._published = True

    def _scan_visible(self) -> None:
        """After recovery every committed segment is in place: list them, link the ones not linked
        yet, publish, then retire this writer's links to anything no longer committed."""
        parquet = self.data_dir / layout.PARQUET_DIR
        # before the first manifest: readers take a manifest only once this folder exists
        (self.data_dir / layout.SNAPSHOT_DIR).mkdir(exist_ok=True)
        self._visible, self._foreign = {}, {}
        linked: set[Path] = set()
        for seg in sorted(parquet.glob(f"*/{layout.PARTITION_PREFIX}*/*{layout.SEGMENT_SUFFIX}")):
            if layout.run_of(seg.parent) is None:
                continue  # the schema placeholders: readers add them
            if self._own_name.match(seg.stem):
                shown = self._link(seg, seg)
                self._visible.setdefault(seg.parent.parent.name, {})[self._rel(seg)] = shown
                linked.add(self.data_dir / shown)
            elif not layout.ANY_WRITER_SEGMENT_RE.match(seg.stem):
                self._foreign.setdefault(self._rel(seg.parent), []).append(self._rel(seg))
        self._publish()
        snapshot = self.data_dir / layout.SNAPSHOT_DIR
        stale = [
            p
            for p in snapshot.glob(f"*/{layout.PARTITION_PREFIX}*/*{layout.SEGMENT_SUFFIX}")
            if self._own_name.match(p.stem) and p not in linked
        ]
        self._retire(stale)

    def _lock_data_dir(self):
        # Two collectors committing into one data dir would corrupt each other's ledger.
        f = open(self.dir / "owner.lock", "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            who = f" as writer {self.writer!r}" if self.writer else ""
            raise DataDirBusy(f"data dir {str(self.data_dir)!r} is in use by another collector{who}") from None
        return f

    def _rel(self, path: Path) -> str:
        return Path(path).relative_to(self.data_dir).as_posix()

    def _log_path(self, gen: int) -> Path:
        return self.dir / f"log-{gen}.jsonl"

    def _checkpoint_path(self, gen: int) -> Path:
        return self.dir / f"checkpoint-{gen}.json"

    def _append(self, record: dict) -> None:
        if self._broken:
            raise LedgerBroken("an earlier ledger write failed; restart the collector to recover")
        path = self._log_path(self._gen)
        size = path.stat().st_size
        try:
            with open(path, "ab") as f:
                f.write(_encode_line(record))
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            # A torn line followed by good ones would hide those from recovery: cut it off,
            # and if even that fails, refuse every further commit.
            try:
                os.truncate(path, size)
            except OSError:
                self._broken = True
            raise
        self._records_in_log += 1
        self._next_commit = max(self._next_commit, record["commit"] + 1)

    def _apply(self, record: dict) -> None:
        """Make a committed record's effect visible; idempotent, so replay can redo it."""
        dirs: set[Path] = set()
        if "add" in record:
            for rel in record["add"]:
                final = self.data_dir / rel
                tmp = layout.temp_name(final)
                if tmp.exists():
                    os.replace(tmp, final)
                    dirs.add(final.parent)
        else:
            compact = record["compact"]
            # Inputs go first: a reader may miss these rows for an instant, never see them twice.
            for rel in compact["inputs"]:
                path = self.data_dir / rel
                if path.exists():
                    path.unlink()
                    dirs.add(path.parent)
            # "output": one output, as records were written before compactions could split rows
            for rel in compact.get("outputs", [compact.get("output")] if "output" in compact else []):
                final = self.data_dir / rel
                tmp = layout.temp_name(final)
                if tmp.exists():
                    os.replace(tmp, final)
                    dirs.add(final.parent)
        for d in dirs:
            layout.fsync_dir(d)

    def _after_commit(self) -> None:
        if self._records_in_log >= CHECKPOINT_EVERY:
            self._checkpoint()

    def _recover(self) -> None:
        gens = sorted(int(p.stem.split("-")[1]) for p in self.dir.glob("checkpoint-*.json"))
        for gen in reversed(gens):
            try:
                state = json.loads(self._checkpoint_path(gen).read_text())
            except (OSError, ValueError):
                continue  # a checkpoint is renamed into place whole, so this is damage; use an older one
            self._gen = gen
            self._next_commit = state["next_commit"]
            self._clients = {c: SeqSet(ranges) for c, ranges in state["clients"].items()}
            break
        log = self._log_path(self._gen)
        if log.exists():
            good_bytes = 0
            with open(log, "rb") as f:
                for line in f:
                    record = _decode_line(line)
                    if record is None:
                        break  # torn tail: that commit never completed, so nothing after it exists
                    good_bytes += len(line)
                    self._next_commit = max(self._next_commit, record["commit"] + 1)
                    self._apply(record)
                    for client, ranges in record.get("acked", {}).items():
                        seq_set = self._clients.setdefault(client, SeqSet())
                        for lo, hi in ranges:
                            seq_set.add_range(lo, hi)
            os.truncate(log, good_bytes)
        self._delete_uncommitted_temps()

    def _delete_uncommitted_temps(self) -> None:
        # Every committed temp file was renamed by the replay above, so any left is uncommitted.
        parquet = self.data_dir / layout.PARQUET_DIR
        for tmp in parquet.glob(f"*/*/.*{layout.SEGMENT_SUFFIX}{layout.TEMP_SUFFIX}"):
            # only this writer's: another collector sharing D may be writing its own right now
            stem = tmp.name[1 : -len(layout.SEGMENT_SUFFIX + layout.TEMP_SUFFIX)]
            if not self._own_name.match(stem):
                continue
            tmp.unlink(missing_ok=True)

    def _checkpoint(self) -> None:
        """Fold the log into a new checkpoint; every record in it is fully applied."""
        new_gen = self._gen + 1
        state = {"next_commit": self._next_commit, "clients": {c: s.ranges for c, s in self._clients.items()}}
        path = self._checkpoint_path(new_gen)
        tmp = path.with_name(path.name + layout.TEMP_SUFFIX)
        with open(tmp, "w") as f:
            json.dump(state, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self._log_path(new_gen).touch()
        layout.fsync_dir(self.dir)
        self._gen, self._records_in_log = new_gen, 0
        for stale in [*self.dir.glob("log-*.jsonl"), *self.dir.glob("checkpoint-*")]:
            if stale not in (path, self._log_path(new_gen)):
                stale.unlink(missing_ok=True)
