"""Find DeepSpeed outputs in a path and parse each with its importer.

A path is a file or a directory (searched recursively, hidden entries skipped).
Every file is offered to each format's ``detect``; a file no format claims is
listed in ``skipped`` (a directory holds configs and scripts too) unless it was
named explicitly, which makes it a problem. Comm records of a rank that has
verbose lines win over the same rank's summary: both count the same collectives,
and the lines have time stamps. Likewise a monitor event that both tensorboard and
csv_monitor recorded (same rank, tag and samples) is kept once, from tensorboard,
which has its wall time. ``notes`` says what was left out and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from collector.data.codec import MAX_WORLD_SIZE
from collector.tools.importers import (
    base,
    comms_summary,
    comms_verbose,
    csv_monitor,
    flight_recorder,
    flops_text,
    osdi_trace,
    parquet_table,
    tensorboard,
    torch_profiler,
)
from collector.tools.importers.base import Parsed

# Order matters only for reporting; text formats may both claim a console log.
FORMATS = (
    tensorboard,
    csv_monitor,
    comms_summary,
    osdi_trace,
    parquet_table,
    flops_text,
    flight_recorder,
    torch_profiler,
    comms_verbose,
)


@dataclass
class ImportResult:
    parsed: Parsed
    files: dict[str, list[str]] = field(default_factory=dict)  # format -> files it read
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def find_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(
        p
        for p in path.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
    )


def formats_of(path: Path) -> list:
    found = []
    for fmt in FORMATS:
        try:
            if fmt.detect(path):
                found.append(fmt)
        except OSError:
            continue
        except Exception:  # content a detector did not foresee: parse() reports it for this file alone
            found.append(fmt)
    return found


def parse_path(path, world_size: int | None = None, files: list[Path] | None = None) -> ImportResult:
    """Parse every recognised file under ``path`` (or just ``files``)."""
    path = Path(path)
    result = ImportResult(Parsed())
    if not path.exists():
        result.parsed.problem(path, "", "no such file or directory")
        return result
    todo = files if files is not None else find_files(path)
    verbose_files, parsed_by_format = [], []
    for file in tqdm(todo, desc="reading", unit="file", disable=None, leave=False):
        fmts = formats_of(file)
        if not fmts:
            if file == path:
                result.parsed.problem(
                    file,
                    "",
                    "not a DeepSpeed output rankscope knows (csv_monitor csv, "
                    "tfevents, log_summary JSON, verbose comms log, flops profile, Parquet, "
                    "Flight Recorder dump, torch.profiler trace)",
                )
            else:
                result.skipped.append(str(file))
            continue
        for fmt in fmts:
            result.files.setdefault(fmt.NAME, []).append(str(file))
            if fmt is comms_verbose:
                verbose_files.append(file)  # parsed last: its sizes need the world size
            else:
                parsed_by_format.append((fmt, _parse_safely(fmt, file)))
    hints = [p.world_size for _, p in parsed_by_format if p.world_size]
    world = world_size or (max(hints) if hints else None)
    parsed_by_format += [(comms_verbose, _parse_safely(comms_verbose, f, world_size=world)) for f in verbose_files]

    ranks_with_lines = {
        rank for fmt, p in parsed_by_format if fmt is comms_verbose for (table, rank) in p.rows if table == "comm"
    }
    for fmt, parsed in parsed_by_format:
        if fmt is comms_summary:
            for key in [k for k in parsed.rows if k[0] == "comm" and k[1] in ranks_with_lines]:
                result.notes.append(
                    f"{parsed.sources[0]}: rank {key[1]}'s summary not imported: the verbose "
                    f"comms lines of that rank hold the same collectives, with time stamps"
                )
                del parsed.rows[key]
    _drop_csv_duplicates(parsed_by_format, result)
    result.notes += flight_recorder.settle([p for fmt, p in parsed_by_format if fmt is flight_recorder])
    result.notes += torch_profiler.settle([p for fmt, p in parsed_by_format if fmt is torch_profiler])
    osdi_trace.settle([p for fmt, p in parsed_by_format if fmt is osdi_trace])
    for _, parsed in parsed_by_format:
        result.parsed.merge(parsed)
    if world_size:
        result.parsed.world_size = world_size
    return result


def _drop_csv_duplicates(parsed_by_format, result: ImportResult) -> None:
    in_tensorboard = {
        (rank, row["tag"], row["samples"])
        for fmt, p in parsed_by_format
        if fmt is tensorboard
        for (table, rank), rows in p.rows.items()
        if table == "monitor"
        for row in rows
    }
    if not in_tensorboard:
        return
    for fmt, parsed in parsed_by_format:
        if fmt is not csv_monitor:
            continue
        for (_table, rank), rows in parsed.rows.items():
            kept = [r for r in rows if (rank, r["tag"], r["samples"]) not in in_tensorboard]
            if len(kept) < len(rows):
                result.notes.append(
                    f"{parsed.sources[0]}: {len(rows) - len(kept)} rows not imported: "
                    "the tensorboard events hold the same values, with time stamps"
                )
                rows[:] = kept


def _parse_safely(fmt, file: Path, **kw) -> Parsed:
    """``fmt.parse(file)`` within the bounds (collector/tools/importers/base.py: size, rows,
    world size); a file over one, or a parser that trips over content it did not foresee,
    costs that file (reported as a problem), never the import of every other one."""
    out = Parsed(sources=[str(file)])
    try:
        base.check_size(file, getattr(fmt, "MAX_BYTES", base.MAX_FILE_BYTES))
        parsed = fmt.parse(file, **kw)
    except base.FileTooCostly as exc:
        return out.refuse("", f"{exc}; file skipped")
    except OSError as exc:
        return out.unreadable(file, exc)
    except Exception as exc:
        out.problem(file, "", f"cannot be parsed as {fmt.NAME} ({type(exc).__name__}: {exc}); file skipped")
        return out
    if parsed.world_size is not None and not 0 < parsed.world_size <= MAX_WORLD_SIZE:
        claimed, parsed.world_size = parsed.world_size, None
        return parsed.refuse("", f"a world size of {claimed:,} is over {MAX_WORLD_SIZE:,}; file skipped")
    return parsed
