"""Generators of malformed and hostile collector input, for tests/integration/server/test_fuzz.py.

Every generator takes a ``random.Random`` and returns ``(kind, raw_bytes)``:
the bytes go on the wire as one Stream frame, unchanged. Seeded, so a failure
names a case that can be replayed."""

from __future__ import annotations

import random
import struct

import numpy as np

from collector.testing.fake_runs import comm_envelope, hello, run_end
from proto import SCHEMA_VERSION, pb

PATHLIKE = [
    "../x",
    "..",
    ".",
    "/etc",
    "a/b",
    "/",
    "run=x",
    "..\\x",
    "x/../../y",
    "\0",
    "~root",
    "a" * 129,
    "",
    " ",
    "@schema",
    "rank\n",
    "%2e%2e",
    "C:\\x",
]
HUGE_U32, HUGE_I32, MIN_I32 = 2**32 - 1, 2**31 - 1, -(2**31)


def _cid(rng: random.Random) -> str:
    # A fresh sender every time: a (client_id, seq) already durable is acked as a
    # duplicate without being decoded again, which would hide the frame's faults.
    return f"fuzz-{rng.getrandbits(64):016x}"


def _valid(rng: random.Random, seq: int = 1) -> pb.Envelope:
    kind = rng.random()
    cid = _cid(rng)
    if kind < 0.2:
        return hello(cid, seq, "fuzzrun", 0, 1)
    if kind < 0.3:
        return run_end(cid, seq, "fuzzrun", 0)
    return comm_envelope(cid, seq, "fuzzrun", 0, 0, rng.randrange(1, 20))


def random_bytes(rng):
    return "random_bytes", rng.randbytes(rng.choice([1, 2, 7, 64, 300, 2000]))


def truncated(rng):
    raw = _valid(rng).SerializeToString()
    return "truncated", raw[: rng.randrange(1, len(raw))]


def bit_flipped(rng):
    raw = bytearray(_valid(rng).SerializeToString())
    for _ in range(rng.randrange(1, 6)):
        raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
    return "bit_flipped", bytes(raw)


def wrong_version(rng):
    env = _valid(rng)
    env.schema_version = rng.choice([0, 2, 3, 100, HUGE_U32])
    return "wrong_version", env.SerializeToString()


def huge_rows(rng):
    env = comm_envelope(_cid(rng), 1, "fuzzrun", 0, 0, 4)
    env.table.rows = rng.choice([HUGE_U32, 2**31, 1_000_001, 5, 3, 0])
    return "huge_rows", env.SerializeToString()


def absurd_numbers(rng):
    env = _valid(rng, seq=rng.choice([0, 1, 2**64 - 1]))
    body = env.WhichOneof("body")
    if body == "hello":
        env.hello.rank = rng.choice([-1, MIN_I32, HUGE_I32, 5])
        env.hello.world_size = rng.choice([0, -1, MIN_I32, HUGE_I32, 1])
        env.hello.started_at_ns = rng.choice([-1, -(2**63), 2**63 - 1])
    elif body == "end":
        env.end.rank = rng.choice([-1, MIN_I32])
        env.end.ended_at_ns = rng.choice([-1, -(2**63), 2**63 - 1])
        env.end.status = rng.choice(["", "exploded", "finished\0", "FINISHED"])
    else:
        env.table.rank = rng.choice([-1, MIN_I32, HUGE_I32])
    return "absurd_numbers", env.SerializeToString()


def bad_columns(rng):
    env = comm_envelope(_cid(rng), 1, "fuzzrun", 0, 0, 4)
    col = env.table.columns[rng.randrange(len(env.table.columns))]
    choice = rng.randrange(6)
    if choice == 0:  # a string column's codes pointing past its dictionary
        s = next(c for c in env.table.columns if c.WhichOneof("values") == "str")
        s.str.codes = struct.pack("<4I", *(rng.choice([1, 7, HUGE_U32]) for _ in range(4)))
    elif choice == 1:  # an empty dictionary
        s = next(c for c in env.table.columns if c.WhichOneof("values") == "str")
        del s.str.dictionary[:]
    elif choice == 2:  # the wrong type
        col.f64 = np.zeros(4).tobytes() if col.WhichOneof("values") != "f64" else b""
        if col.WhichOneof("values") == "f64":
            col.i64 = np.zeros(4, dtype="<i8").tobytes()
    elif choice == 3:  # a column twice
        env.table.columns.append(col)
    elif choice == 4:  # odd byte counts
        env.table.columns[0].i64 = rng.randbytes(rng.choice([1, 7, 31, 33]))
    else:  # a column name that is a path, or empty
        col.name = rng.choice(PATHLIKE)
    return "bad_columns", env.SerializeToString()


def path_names(rng):
    name = rng.choice(PATHLIKE)
    env = _valid(rng)
    body = env.WhichOneof("body")
    target = rng.randrange(3)
    if target == 0:
        getattr(env, body).run_id = name
    elif target == 1 and body == "table":
        env.table.table = name
    else:
        env.client_id = name
    return "path_names", env.SerializeToString()


def bad_utf8(rng):
    """A string field holding bytes that are not UTF-8 (protobuf refuses to decode them)."""
    marker = "Z" * 12
    env = _valid(rng)
    field = rng.randrange(3)
    if field == 0:
        env.client_id = marker
    elif env.WhichOneof("body") == "table" and field == 1:
        env.table.columns[rng.randrange(len(env.table.columns))].name = marker
    else:
        getattr(env, env.WhichOneof("body")).run_id = marker
    bad = rng.choice([b"\xff" * 12, b"\xc0\xaf" * 6, b"\xed\xa0\x80" * 4, b"ab\x80cdefghijk"])
    return "bad_utf8", env.SerializeToString().replace(marker.encode(), bad)


def empty_body(rng):
    return "empty_body", pb.Envelope(
        schema_version=SCHEMA_VERSION, client_id=_cid(rng), seq=rng.randrange(0, 5)
    ).SerializeToString()


GENERATORS = [
    random_bytes,
    truncated,
    bit_flipped,
    wrong_version,
    huge_rows,
    absurd_numbers,
    bad_columns,
    path_names,
    bad_utf8,
    empty_body,
]


def hostile(rng: random.Random, n: int):
    """n hostile frames, the generators taken in turn."""
    for i in range(n):
        yield GENERATORS[i % len(GENERATORS)](rng)
