"""DeepSpeed's tensorboard monitor: ``<output_path>/<job_name>/events.out.tfevents.*``.

DeepSpeed calls ``SummaryWriter.add_scalar(tag, value, global_samples)`` on
rank 0, so each scalar becomes a monitor row with ``samples`` = ``step`` = the
event's step and ``time_ns`` = its wall time.

The file is TFRecord framed: ``uint64 length, uint32 masked crc32c(length),
data, uint32 masked crc32c(data)``, each ``data`` an ``Event`` proto. We read
the framing ourselves so that a file cut short or damaged is reported with the
record and byte where it breaks, keeping every record before it.
"""

from __future__ import annotations

import struct
from pathlib import Path

from google.protobuf.message import DecodeError
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

from collector.tools.importers.base import Parsed

NAME = "tensorboard"
_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")


def detect(path: Path) -> bool:
    return "tfevents" in path.name


def _scalar(value) -> float | None:
    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind == "tensor" and value.tensor.float_val:  # new-style scalar summaries
        return float(value.tensor.float_val[0])
    if kind == "tensor" and value.tensor.double_val:
        return float(value.tensor.double_val[0])
    return None


def parse(path: Path, rank: int = 0) -> Parsed:
    out = Parsed(sources=[str(path)])
    try:
        data = path.read_bytes()
    except OSError as exc:
        return out.unreadable(path, exc)
    at, record = 0, 0
    while at < len(data):
        record += 1
        where = f"record {record} (byte {at})"
        if at + _HEADER.size > len(data):
            out.problem(path, where, "file ends inside a record header (cut short?)")
            break
        length, length_crc = _HEADER.unpack_from(data, at)
        if masked_crc32c(data[at : at + 8]) != length_crc:
            out.problem(path, where, "record length fails its checksum; the rest of the file is unreadable")
            break
        start = at + _HEADER.size
        end = start + length
        if end + _FOOTER.size > len(data):
            out.problem(path, where, f"record needs {length} bytes, file ends first (cut short?)")
            break
        payload = data[start:end]
        at = end + _FOOTER.size
        if masked_crc32c(payload) != _FOOTER.unpack_from(data, end)[0]:
            out.problem(path, where, "record data fails its checksum; skipped")
            continue
        event = event_pb2.Event()
        try:
            event.ParseFromString(payload)
        except DecodeError:
            out.problem(path, where, "not an Event record; skipped")
            continue
        if not event.HasField("summary"):
            continue  # file_version header, graphs, ...
        for value in event.summary.value:
            scalar = _scalar(value)
            if scalar is None:
                continue  # histograms, images: nothing for the monitor table
            out.add(
                "monitor",
                rank,
                step=event.step,
                tag=value.tag,
                value=scalar,
                samples=event.step,
                time_ns=round(event.wall_time * 1e9),
            )
    return out
