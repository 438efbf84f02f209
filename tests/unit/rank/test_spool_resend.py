"""Resending a dead process's spool file to a real collector, exactly once, when part of it cannot
be delivered: an envelope the collector refuses (seq 3 of 5) or a record that does not decode is set
aside in the file's side file (kept, counted, logged once), the rest is delivered, the file is done
with, and one bad file never holds up another writer's good one.

Split by tier: what needs processes, sockets or seconds is in tests/integration/rank/test_spool_resend.py."""

from __future__ import annotations

from pathlib import Path

from collector.rank import spool


def _write_raw(path: Path, endpoint: str, records: list[bytes]) -> None:
    target = endpoint.encode()
    with open(path, "wb") as f:
        f.write(spool.MAGIC + spool._LEN.pack(len(target)) + target)
        for data in records:
            f.write(spool._LEN.pack(len(data)) + data)


def test_a_damaged_record_in_a_file_reads_as_a_spool_error_not_a_decode_error(tmp_path):
    path = tmp_path / f"x.1.a-{1:012d}-{1:012d}{spool.SUFFIX}"
    _write_raw(path, "e:1", [b"\xff\xff"])
    try:
        spool.read(path)
    except spool.SpoolError as e:
        assert str(path) in str(e) and "no Envelope" in str(e)
    else:
        raise AssertionError("read took a damaged record")
