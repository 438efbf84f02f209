"""``rankscope import --watch DIR``: ingest every file that appears in DIR, exactly once.

What is ingested (hidden files and ``*.tmp`` are ignored):

- spool files (``*.rsspool``, collector/spool.py) -- their envelopes as they are,
  so the collector's (client_id, seq) dedupe drops whatever was already sent;
- archives (``rankscope export --archive``) -- the run under its own run id;
- DeepSpeed outputs and exported Parquet (collector/importers) -- into one run
  named ``--run`` (default: DIR's name) whose run id is derived from DIR and the
  name, so it is the same run across restarts. The run has no RunEnd: it is
  "running" while files may still come.

A file is taken once it has not changed for ``--settle`` seconds (DeepSpeed and
rsync write in place). Exactly once: a ledger in ``DIR/.rankscope-watch.jsonl``
lists every file taken (path, size, mtime, sha256, rows sent), appended and
fsync'd after its rows are durable; at start-up the folder is scanned against
it, so files dropped while the watcher was stopped are taken then, and nothing
is taken twice. Should the watcher die between the commit and the ledger line,
the file is sent again with the same client ids and seqs (derived from its
content), and the collector's dedupe keeps one copy.

Files DeepSpeed appends to while it trains (csv_monitor files, tensorboard
event files, a console log with verbose comms lines) are followed: when one has
grown and its start is unchanged, the rows past those already sent are sent.
Any other change to a taken file (a rewrite) is reported, not read again. A file
that cannot be read is reported by name (with the line or record) and recorded,
so it is not retried; the rest of the folder is unaffected.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import DecodeError
from tqdm import tqdm
from watchdog.events import FileSystemEventHandler
from watchdog.observers import Observer

from collector.data.codec import CodecError, check_header, envelope_rows
from collector.data.layout import new_run_id
from collector.rank import spool
from collector.tools.export import is_archive
from collector.tools.importers import comms_verbose, csv_monitor, tensorboard
from collector.tools.importers.dispatch import formats_of, parse_path
from collector.tools.importers.ingest import open_sink
from collector.tools.importers.sink import SinkError, run_envelopes
from proto import pb

LEDGER_NAME = ".rankscope-watch.jsonl"
RESCAN_S = 2.0  # fallback rescan period; watchdog events trigger one at once
APPENDED_FORMATS = (csv_monitor, tensorboard, comms_verbose)  # DeepSpeed appends to these while training


@dataclass(frozen=True)
class Seen:
    size: int
    mtime_ns: int


def _sha256(path: Path, limit: int | None = None) -> str:
    """Of the whole file, or of its first ``limit`` bytes."""
    h = hashlib.sha256()
    left = limit if limit is not None else float("inf")
    with open(path, "rb") as f:
        while left > 0 and (chunk := f.read(int(min(1 << 20, left)))):
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


class WatchLedger:
    """The files already taken, by path relative to the watched folder."""

    def __init__(self, folder: Path):
        self.path = folder / LEDGER_NAME
        self.taken: dict[str, dict] = {}  # path -> its latest entry (a grown file has several)
        if self.path.exists():
            for line in self.path.read_text(errors="replace").splitlines():
                try:
                    rec = json.loads(line)
                    self.taken[rec["path"]] = rec
                except (ValueError, KeyError, TypeError):
                    continue  # a torn last line: that file was not recorded, so it is retaken
        self._f = open(self.path, "a")

    def seen(self, rel: str) -> Seen | None:
        entry = self.taken.get(rel)
        return Seen(entry["size"], entry["mtime_ns"]) if entry else None

    def record(self, entries: list[dict]) -> None:
        for e in entries:
            self._f.write(json.dumps(e) + "\n")
            self.taken[e["path"]] = e
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def _valid_envelopes(path: Path, envelopes: list[pb.Envelope]) -> tuple[list[pb.Envelope], list[str]]:
    """The envelopes of a spool file the collector would accept, and a problem for each other
    one: a damaged envelope costs itself, not the file and not the files beside it."""
    good, problems = [], []
    for number, env in enumerate(envelopes, 1):
        try:
            check_header(env)
            envelope_rows(env)
        except CodecError as exc:
            problems.append(f"{path}:record {number}: {exc}; skipped")
            continue
        good.append(env)
    return good, problems


class Watcher:
    def __init__(
        self,
        folder,
        sink,
        *,
        run: str | None = None,
        world_size: int | None = None,
        settle_s: float = 1.0,
        out=None,
        err=None,
    ):
        self.folder = Path(folder).resolve()
        self.sink = sink
        self.run_name = run or self.folder.name
        self.run_id = new_run_id(self.run_name, stable_key=f"{self.folder}\0{self.run_name}")
        self.world_size = world_size
        self.settle_s = settle_s
        # looked up now, not bound at import: whoever imported this module may have swapped sys.stdout since
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.ledger = WatchLedger(self.folder)
        self._pending: dict[str, tuple[Seen, float]] = {}  # path -> (last seen, since when unchanged)
        self._warned_changed: set[str] = set()
        self.wake = threading.Event()
        self.files_taken = 0

    def _candidates(self) -> list[Path]:
        found = []
        for root, dirs, files in os.walk(self.folder):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            found += [Path(root) / f for f in sorted(files) if not f.startswith(".") and not f.endswith(".tmp")]
        return found

    def settled(self) -> list[tuple[Path, Seen]]:
        """Files not yet taken that have not changed for settle_s."""
        now, ready, current = time.monotonic(), [], set()
        for path in self._candidates():
            rel = str(path.relative_to(self.folder))
            current.add(rel)
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            seen = Seen(st.st_size, st.st_mtime_ns)
            before = self.ledger.seen(rel)
            if before == seen or rel in self._warned_changed:
                continue
            if before is not None and not (self.ledger.taken[rel].get("grows") and seen.size > before.size):
                self._rewritten(path, rel)
                continue
            last = self._pending.get(rel)
            if last is None or last[0] != seen:
                self._pending[rel] = (seen, now)
            elif now - last[1] >= self.settle_s:
                ready.append((path, seen))
        for gone in set(self._pending) - current:  # deleted before it settled
            del self._pending[gone]
        return ready

    def _rewritten(self, path: Path, rel: str) -> None:
        self._warned_changed.add(rel)
        self._pending.pop(rel, None)
        print(f"watch: {path} changed after it was ingested (not by appending); not read again", file=self.err)

    def _streams_for(self, path: Path, sha: str, before: dict | None):
        """(streams, problems, rows sent per 'table:rank', grows) for one file; for a grown
        file (``before`` is its last ledger entry) only the rows past those already sent."""
        if path.name.endswith(spool.SUFFIX):
            try:
                envelopes = spool.read(path)
            except (spool.SpoolError, OSError, ValueError, DecodeError) as exc:
                return [], [str(exc) if str(path) in str(exc) else f"{path}: {exc}"], {}, False
            good, problems = _valid_envelopes(path, envelopes)
            return ([good] if good else []), problems, {}, False
        if is_archive(path):
            from collector.tools.replay import restore_streams

            try:
                _, streams = restore_streams(path)
                return streams, [], {}, False
            except Exception as exc:  # a damaged archive must not stop the watcher
                return [], [f"{path}: cannot restore archive: {exc}"], {}, False
        formats = formats_of(path)
        if not formats:
            return [], [f"{path}: not a file rankscope ingests; skipped"], {}, False
        grows = all(f in APPENDED_FORMATS for f in formats)
        parsed = parse_path(path, world_size=self.world_size, files=[path]).parsed
        problems = [str(p) for p in parsed.problems]
        counts = {f"{table}:{rank}": len(rows) for (table, rank), rows in parsed.rows.items()}
        if before is not None:  # the start of the file was taken already: so were its rows and problems
            problems = problems[before.get("problems", 0) :]
            for (table, rank), rows in list(parsed.rows.items()):
                del rows[: before.get("rows", {}).get(f"{table}:{rank}", 0)]
                if not rows:
                    del parsed.rows[(table, rank)]
        if not parsed.rows:
            return [], problems, counts, grows
        streams = run_envelopes(
            parsed,
            run_id=self.run_id,
            run_name=self.run_name,
            source="import",
            client_key=f"watch\0{path.relative_to(self.folder)}\0{sha}",
            default_ns=path.stat().st_mtime_ns,
            with_end=False,
            only_ranks_with_rows=True,
        )
        return streams, problems, counts, grows

    def take(self, ready: list[tuple[Path, Seen]]) -> int:
        """Ingest a batch of settled files; one durable send, then one ledger append."""
        streams, entries = [], []
        for path, seen in tqdm(ready, desc="watch: reading", unit="file", disable=None, leave=False):
            rel = str(path.relative_to(self.folder))
            before = self.ledger.taken.get(rel)
            try:
                sha = _sha256(path)
                if before is not None and _sha256(path, before["size"]) != before["sha256"]:
                    self._rewritten(path, rel)
                    continue
            except FileNotFoundError:
                continue
            try:
                file_streams, problems, counts, grows = self._streams_for(path, sha, before)
            except Exception as exc:  # content no parser foresaw: that file is rejected, the watch goes on
                file_streams, problems, counts, grows = [], [f"{path}: cannot be read ({exc!r})"], {}, False
            for problem in problems:
                print(f"skipped: {problem}", file=self.err)
            streams += file_streams
            entries.append(
                {
                    "path": rel,
                    "size": seen.size,
                    "mtime_ns": seen.mtime_ns,
                    "sha256": sha,
                    "problems": len(problems) + (before or {}).get("problems", 0),
                    "rows": counts,
                    "grows": grows,
                }
            )
        if streams:
            self.sink.send(streams)
        self.ledger.record(entries)
        for e in entries:
            self._pending.pop(e["path"], None)
        self.files_taken += len(entries)
        return len(entries)

    def scan_once(self) -> int:
        """Take everything that is there and settled; waits out the settle time of new files."""
        total = 0
        while True:
            ready = self.settled()
            if ready:
                n = self.take(ready)
                total += n
                print(f"watch: ingested {n} files ({self.files_taken} since start)", file=self.out, flush=True)
                continue
            if not self._pending:
                return total
            time.sleep(min(self.settle_s, 0.2))

    def run(self, stop: threading.Event) -> None:
        watcher = self

        class Wake(FileSystemEventHandler):
            def on_any_event(self, event):
                watcher.wake.set()

        observer = Observer()
        observer.schedule(Wake(), str(self.folder), recursive=True)
        observer.start()
        try:
            while not stop.is_set():
                ready = self.settled()
                if ready:
                    n = self.take(ready)
                    print(f"watch: ingested {n} files ({self.files_taken} since start)", file=self.out, flush=True)
                    continue
                self.wake.wait(min(self.settle_s, 0.2) if self._pending else RESCAN_S)
                self.wake.clear()
        finally:
            observer.stop()
            observer.join()

    def close(self) -> None:
        self.ledger.close()


def main(args) -> int:
    import signal

    from collector.server.ledger import DataDirBusy

    folder = Path(args.watch)
    if not folder.is_dir():
        print(f"rankscope import --watch: {folder} is not a folder", file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        with open_sink(args.data_dir, args.endpoint, args.token, args.tls_ca) as sink:
            watcher = Watcher(folder, sink, run=args.run, world_size=args.world_size, settle_s=args.settle)
            try:
                print(f"watching {watcher.folder} (run {watcher.run_id}); Ctrl-C stops", flush=True)
                watcher.scan_once()
                if not args.once:
                    watcher.run(stop)
            finally:
                watcher.close()
    except DataDirBusy:
        print(
            f"rankscope import: a collector is running on {args.data_dir}; watch into it with --endpoint HOST:PORT",
            file=sys.stderr,
        )
        return 1
    except (SinkError, OSError) as exc:
        print(f"rankscope import --watch: {exc}", file=sys.stderr)
        return 1
    print(f"watch: stopped after {watcher.files_taken} files", flush=True)
    return 0
