"""DeepSpeed's csv_monitor: ``<output_path>/<job_name>/<tag>.csv``, one file per tag.

DeepSpeed (deepspeed/monitor/csv_monitor.py) names the file after the tag with
'/' and ' ' replaced by '_', and writes the header ``step,<last '/' part of the
tag>`` then ``<samples>,<value>`` rows (the "step" column holds the engine's
global_samples). Only rank 0 writes, so rows are rank 0's.

The tag is rebuilt from the file name and the header: the header is the tag's
last part verbatim, and the '_' in the part before it are read back as '/'
(``Train_Samples_lr.csv`` with header ``lr`` -> ``Train/Samples/lr``), which
gives DeepSpeed's own tags exactly and matches what the tensorboard importer
reads for the same event. Like the trainer's monitor, ``step`` = ``samples``.
"""

from __future__ import annotations

import csv
from pathlib import Path

from collector.tools.importers.base import Parsed

NAME = "csv_monitor"


def detect(path: Path) -> bool:
    if path.suffix != ".csv":
        return False
    try:
        with open(path, newline="", errors="replace") as f:
            header = next(csv.reader(f), [])
    except OSError:
        return False
    return len(header) == 2 and header[0] == "step"


def tag_for(path: Path, header: str) -> str:
    stem = path.stem
    sanitized = header.replace("/", "_").replace(" ", "_")
    if stem == sanitized:
        return header
    if stem.endswith("_" + sanitized):
        return stem[: -len(sanitized) - 1].replace("_", "/") + "/" + header
    return stem  # renamed file: its name is the best tag we have


def parse(path: Path, rank: int = 0) -> Parsed:
    out = Parsed(sources=[str(path)])
    try:
        f = open(path, newline="", errors="replace")
    except OSError as exc:
        return out.unreadable(path, exc)
    with f:
        reader = csv.reader(f)
        try:
            header = next(reader, None)
        except csv.Error as exc:
            out.problem(path, "line 1", f"{exc}; file skipped")
            return out
        if header is None or len(header) != 2 or header[0] != "step":
            out.problem(path, "line 1", f"expected the header 'step,<tag>', got {header!r}")
            return out
        tag = tag_for(path, header[1])
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:  # a field over the csv module's limit, a stray NUL...
                out.problem(path, f"line {reader.line_num}", f"{exc}; the rest of the file is skipped")
                break
            where = f"line {reader.line_num}"
            if not row:
                continue
            if len(row) != 2:
                out.problem(path, where, f"expected 2 fields (step,value), got {len(row)}")
                continue
            try:
                samples = int(row[0])
                value = float(row[1])
            except ValueError:
                out.problem(path, where, f"not a number: {row!r}")
                continue
            out.add("monitor", rank, where, step=samples, tag=tag, value=value, samples=samples, time_ns=None)
    return out
