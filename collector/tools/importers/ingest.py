"""``rankscope import PATH``: parse DeepSpeed outputs and store them as a new run."""

from __future__ import annotations

import contextlib
import gc
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from collector.data.layout import new_run_id
from collector.tools.importers.base import Problem
from collector.tools.importers.dispatch import parse_path
from collector.tools.importers.sink import GrpcSink, StoreSink, run_envelopes


@dataclass
class ImportReport:
    run_id: str
    rows: dict[str, int]
    files: int
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    world_size: int | None = None
    hints: dict = field(default_factory=dict)  # what a format's settle() found across files (importers/base.py)


def open_sink(data_dir=None, endpoint: str | None = None, token: str | None = None, tls_ca: str | None = None):
    return GrpcSink(endpoint, token, tls_ca=tls_ca) if endpoint else StoreSink(data_dir)


@contextlib.contextmanager
def cyclic_gc_paused():
    """Python's cyclic garbage collector off for the length of one import, as it was before after it.

    What an import holds is acyclic (the dicts and lists of parsed files, rows, Arrow tables): reference
    counting frees it, and the collector's passes only walk it again and again as it grows. A 1,024-rank
    Flight Recorder import holds ~2.1M stack-frame dicts until it ends (10 a call): its passes over them were 2.1 of
    2.6 s of unpickling the dumps (0.46 s without), about a fifth of ``rankscope fr``'s whole run."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def import_path(
    path,
    *,
    sink,
    run: str | None = None,
    run_id: str | None = None,
    world_size: int | None = None,
    files: list[Path] | None = None,
    client_key: str | None = None,
) -> ImportReport:
    with cyclic_gc_paused():
        return _import_path(Path(path), sink, run, run_id, world_size, files, client_key)


def _import_path(path: Path, sink, run, run_id, world_size, files, client_key) -> ImportReport:
    result = parse_path(path, world_size=world_size, files=files)
    parsed = result.parsed
    name = run or path.resolve().name
    run_id = run_id or new_run_id(name)
    report = ImportReport(
        run_id=run_id,
        files=sum(len(v) for v in result.files.values()),
        rows={t: parsed.row_count(t) for t in sorted({t for t, _ in parsed.rows})},
        problems=parsed.problems,
        notes=result.notes,
        skipped=result.skipped,
        world_size=parsed.world_size,
        hints=parsed.hints,
    )
    if not parsed.rows:
        return report
    streams = run_envelopes(
        parsed,
        run_id=run_id,
        run_name=name,
        source="import",
        client_key=client_key or run_id,
        default_ns=int(path.stat().st_mtime_ns),
        # collectives still in flight (a Flight Recorder dump of a hang): the run did not end
        with_end=not parsed.row_count("inflight"),
    )
    total = sum(len(s) for s in streams)
    with tqdm(total=total, desc=f"import {name}", unit="batch", disable=None, leave=False) as bar:

        def counted(stream):
            for env in stream:
                yield env
                bar.update(1)

        sink.send([counted(s) for s in streams])
    return report


def main(args) -> int:
    """The CLI: print what was imported, and every problem with its file and line."""
    from collector.server.ledger import DataDirBusy
    from collector.tools.importers.sink import SinkError

    if not args.path:
        print("rankscope import: give a PATH (or --watch DIR)", file=sys.stderr)
        return 2
    try:
        with open_sink(args.data_dir, args.endpoint, args.token, args.tls_ca) as sink:
            report = import_path(args.path, sink=sink, run=args.run, world_size=args.world_size)
    except DataDirBusy:
        print(
            f"rankscope import: a collector is running on {args.data_dir}; import through it with --endpoint HOST:PORT",
            file=sys.stderr,
        )
        return 1
    except SinkError as exc:
        print(f"rankscope import: {exc}", file=sys.stderr)
        return 1
    for note in report.notes:
        print(f"note: {note}")
    if report.skipped:
        shown = ", ".join(report.skipped[:5]) + (", ..." if len(report.skipped) > 5 else "")
        print(f"left alone {len(report.skipped)} files that are no DeepSpeed output: {shown}")
    for problem in report.problems:
        print(f"skipped: {problem}", file=sys.stderr)
    if not report.rows:
        print(f"rankscope import: nothing to import in {args.path}", file=sys.stderr)
        return 1
    rows = ", ".join(f"{n} {t}" for t, n in report.rows.items())
    print(
        f"imported run {report.run_id} from {report.files} files: {rows}"
        + (f"; {len(report.problems)} problems, skipped (listed above)" if report.problems else "")
    )
    # Imported what it could; non-zero still, so that a script notices what was left out.
    return 1 if report.problems else 0
