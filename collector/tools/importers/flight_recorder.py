"""PyTorch Flight Recorder dumps: one per rank, JSON (``_dump_fr_trace_json``) or pickle
(``_dump_fr_trace``, what NCCL's watchdog writes to ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>``).

A dump is ``{"version", "pg_config": {pg: {"desc", "ranks"}}, "entries": [...]}``; each entry is
one collective a rank issued: its process group, ``collective_seq_id`` (rankscope's ``seq``: the
same number, DESIGN.md's collective identity), ``profiling_name`` ("nccl:all_reduce"), input and
output sizes and dtypes, ``state`` and times, and the Python ``frames`` that issued it (pickles
only: torch 2.13's JSON dump leaves them out).

Which rank wrote a dump: its ``rank`` key where the version has one, else the number its file
name ends in (``fr3.json``, ``nccl_trace_rank_3``, ``host-a.example_rank3``, any
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` prefix). Groups take the hook's names: the default group is
``world``, another ``g[<ranks>]`` (``g[<ranks>]#<pg>`` for a second group of the same ranks).

Who is in a group, from every place a dump says it: ``pg_config`` of any rank (NCCL lists every
group it made a communicator for). Where no dump says (gloo lists only the default group, and with
``ranks '[]'``): the world is every rank up to the highest one that left a dump or is named, and a
subgroup is the ranks whose dumps hold its entries -- inferred, and the import says so in a note
(a member that never entered any of the group's collectives cannot be seen that way).

Parsing is per file and keeps each entry as it was read; ``settle`` decides, across every rank's
dump of one import, what the rows are. Completed or in flight: where the backend tracks state
(NCCL: a ``time_discovered_*`` time, a ``started``/``completed`` state), the state says. gloo
records every entry as ``scheduled``; then an entry counts as completed when every member that
left a dump entered that seq or a later one -- the match torch's own analyzer
(``torch.distributed.flight_recorder.fr_trace --allow-incomplete-ranks``) makes. Completed entries
become ``comm`` rows, the rest ``inflight`` rows (``entered_ns`` = when the entry was made,
``time_ns`` = when the dump was written, its file's mtime) and one ``stacks`` row each from its
frames; each rank's newest entry gives a ``stacks`` row too ("last seen"), so a rank that never
arrived shows where it was. A dump is written after the fact, so an entry some member never
entered is hung whatever the dump's age (``hang_after_s`` 0); one every member entered and that
is still running is judged by its own timeout. A run with an in-flight row gets no RunEnd, so the
``hangs`` and ``desyncs`` views and ``rankscope health`` judge it as they judge a live hang.

p2p entries (send/recv: ``is_p2p``, NCCL only: gloo records none) become rows as the hook writes
them: group ``p2p[src->dst]`` in global ranks (the name's group ranks mapped through the group's
members), ``seq`` counted per direction; done where the state says so, else in flight, hung at once when
the peer's dump holds no matching op. Pickles
load with no class allowed: a dump holds only dicts, lists, tuples, strings and numbers, and
anything else is refused unexecuted. Every field is checked for its type before use: an entry that
is not what the format says is named (file, entry, field) and skipped, never a traceback.
"""

from __future__ import annotations

import ast
import functools
import io
import json
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path

from collector.data.codec import MAX_WORLD_SIZE
from collector.data.schema import rank_ranges
from collector.tools.importers import base
from collector.tools.importers.base import Parsed

NAME = "flight_recorder"
_WORLD = "\0world"  # the key of the default group, whatever a rank's dump names it
WITHOUT_DUMP = "flight_recorder.without_dump"  # the hint settle() leaves: member ranks that left no dump
_TRACKED_STATES = {"started", "completed"}
# Flight Recorder's op names (after "nccl:"/"gloo:") -> torch.distributed's function names
OPS = {
    "all_reduce": "all_reduce",
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce_coalesced",
    "all_reduce_coalesced": "all_reduce_coalesced",
    "all_gather": "all_gather",
    "allgather": "all_gather",
    "_allgather_base": "all_gather_into_tensor",
    "_all_gather_base": "all_gather_into_tensor",
    "all_gather_single": "all_gather_into_tensor",
    "all_gather_v": "all_gather",
    "ALLGATHER_coalesced": "all_gather_coalesced",
    "all_gather_into_tensor": "all_gather_into_tensor",
    "allgather_coalesced": "all_gather_coalesced",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_tensor": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "reduce_scatter_single": "reduce_scatter_tensor",
    "reduce_scatter_v": "reduce_scatter",
    "REDUCE_SCATTER_coalesced": "reduce_scatter_tensor_coalesced",
    "all_to_all": "all_to_all",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all_single",
    "all_to_all_single": "all_to_all_single",
    "all_to_all_v_single": "all_to_all_single",
    "_broadcast_oop": "broadcast",
    "_reduce_oop": "reduce",
    "all_reduce_barrier": "barrier",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
}
# the side of an entry that holds the op's data size S (nccl-tests): the gathered output for gathers
_OUTPUT_SIDE = {"all_gather", "all_gather_into_tensor", "all_gather_coalesced", "all_gather_into_tensor_coalesced"}
# c10 ScalarType names -> (torch dtype name as comm.dtype holds it, bytes per element)
DTYPES = {
    "Float": ("float32", 4),
    "Double": ("float64", 8),
    "Half": ("float16", 2),
    "BFloat16": ("bfloat16", 2),
    "Long": ("int64", 8),
    "Int": ("int32", 4),
    "Short": ("int16", 2),
    "Char": ("int8", 1),
    "Byte": ("uint8", 1),
    "Bool": ("bool", 1),
    "ComplexFloat": ("complex64", 8),
    "ComplexDouble": ("complex128", 16),
    "Float8_e4m3fn": ("float8_e4m3fn", 1),
    "Float8_e5m2": ("float8_e5m2", 1),
}
_RANK_IN_NAME = re.compile(r"(\d+)$")
MAX_STACK_FRAMES = 64  # innermost frames kept, as the hook's stack capture keeps
MAX_DIMS = 64  # a tensor of more dimensions than this is no tensor torch made
MAX_RANK_LIST = 1 << 20  # a pg_config "ranks" longer than this (characters) is not read


class _DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"a Flight Recorder dump holds no objects, but this one names {module}.{name}")


class BadEntry(ValueError):
    """An entry (or a field of the dump) that is not what the format says; the message names the field."""


@dataclass
class Entry:
    """One Flight Recorder entry as read, before the import knows who else was in its group."""

    index: int
    pg: str  # the group's key across ranks (_WORLD for the default group)
    pg_label: str  # the group as the dump names it, for messages: "1 (undefined)"
    seq: int
    op: str
    dtype: str | None
    numel: int
    bytes: int | None
    state: str
    start_ns: int | None
    end_ns: int | None
    created_ns: int | None
    timeout_s: float
    thread_name: str | None
    thread_id: int | None
    frames: object  # formatted only for the entries that get a stacks row (most never do)
    p2p: tuple[int, int] | None = None  # a send/recv: (source, destination) as the group numbers its ranks


@dataclass
class Dump:
    """What ``parse`` keeps of one rank's dump for ``settle``."""

    path: str
    rank: int
    stated: dict[str, list[int]] = field(default_factory=dict)  # group key -> members, where pg_config says
    entries: list[Entry] = field(default_factory=list)
    tracked: bool = False  # the backend records each entry's state (NCCL)
    dumped_ns: int = 0


def _load(path: Path) -> dict | None:
    """The dump in ``path``, or None when it is no Flight Recorder dump."""
    head = path.open("rb").read(1)
    if head == b"\x80":  # a pickle (protocol 2+)
        base.check_size(path, base.MAX_FILE_BYTES)
        data = _DataOnly(io.BytesIO(path.read_bytes())).load()
    elif head == b"{" or path.suffix == ".json":
        data = base.load_json(path, max_bytes=base.MAX_FILE_BYTES)
    else:
        return None
    return data if isinstance(data, dict) and "entries" in data and "pg_config" in data else None


def detect(path: Path) -> bool:
    if "tfevents" in path.name or path.suffix in (".csv", ".parquet", ".txt", ".log", ".py"):
        return False
    with path.open("rb") as f:
        head = f.read(4096)
    if head[:1] == b"\x80":
        return b"pg_config" in head
    # json.dumps sorts the keys: "entries" (long) may come before "pg_config"
    return head[:1] == b"{" and b'"entries"' in head and (b'"comm_lib_version"' in head or b'"pg_config"' in head)


def _rank_of(path: Path, dump: dict) -> int | None:
    if isinstance(dump.get("rank"), int) and not isinstance(dump.get("rank"), bool):
        return dump["rank"]
    m = _RANK_IN_NAME.search(path.name.removesuffix(".json").removesuffix(".pkl"))
    return int(m.group(1)) if m else None


@functools.lru_cache(maxsize=256)  # every rank's dump repeats the same lists
def _ranks_text(value: str) -> tuple[int, ...]:
    if len(value) > MAX_RANK_LIST:
        raise BadEntry(f"'ranks' is {len(value):,} characters long")
    try:
        parsed = json.loads(value) if value.strip() else []  # '[0, 1]' as NCCL writes it
    except ValueError:
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
            raise BadEntry(f"'ranks' is not a list of ranks ({value[:40]!r})") from exc
    if isinstance(parsed, str):
        raise BadEntry(f"'ranks' is not a list of ranks ({value[:40]!r})")
    return tuple(_ranks(parsed))


def _ranks(value) -> list[int]:
    """A pg_config ``ranks`` ('[0, 1]' as NCCL writes it, or a list) as sorted ints."""
    if isinstance(value, str):
        return list(_ranks_text(value))
    if not isinstance(value, list | tuple) or not all(
        isinstance(r, int) and not isinstance(r, bool) and 0 <= r < MAX_WORLD_SIZE for r in value
    ):
        raise BadEntry(f"'ranks' is not a list of ranks below {MAX_WORLD_SIZE:,} ({str(value)[:40]!r})")
    return sorted(set(value))


def _stated_groups(dump: dict, out: Parsed, path: Path) -> tuple[dict[str, list[int]], set[str]]:
    """(group key -> members where this dump's pg_config lists them; the pg names that are the world)."""
    stated, world_names = {}, set()
    config = dump.get("pg_config")
    if not isinstance(config, dict):
        out.problem(path, "pg_config", f"is a {type(config).__name__}, not a map of process groups; ignored")
        return stated, world_names
    for pg, cfg in config.items():
        if not isinstance(cfg, dict):
            out.problem(path, f"pg_config[{str(pg)[:40]!r}]", "is not a map with 'desc' and 'ranks'; ignored")
            continue
        world = cfg.get("desc") == base.WORLD_DESC or pg == ""  # torch 2.13's gloo keys the world by ''
        if world:
            world_names.add(str(pg))
        try:
            ranks = _ranks(cfg.get("ranks", []))
        except BadEntry as exc:
            out.problem(path, f"pg_config[{str(pg)[:40]!r}]", f"{exc}; its members are inferred instead")
            continue
        if ranks:
            stated[_WORLD if world else str(pg)] = ranks
    return stated, world_names


def _int(e: dict, key: str, default=None) -> int | None:
    value = e.get(key, default)
    if value is None or type(value) is int:  # type(), not isinstance: a bool is no number here
        return value
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise BadEntry(f"{key!r} is a {type(value).__name__}, not a number")
    try:
        return int(value)
    except (ValueError, OverflowError) as exc:
        raise BadEntry(f"{key!r} is {str(value)[:40]!r}, not a number") from exc


def _elements(sizes, key: str) -> int:
    if sizes is None:
        return 0
    if not isinstance(sizes, list | tuple):
        raise BadEntry(f"{key!r} is a {type(sizes).__name__}, not a list of shapes")
    total = 0
    for shape in sizes:  # plain loops: this runs for every entry of every rank
        if type(shape) not in (list, tuple) or len(shape) > MAX_DIMS:
            raise BadEntry(f"{key!r} holds {str(shape)[:40]!r}, not a shape")
        n = 1
        for d in shape:
            if type(d) is not int or d < 0:
                raise BadEntry(f"{key!r} holds {str(shape)[:40]!r}, not a shape of sizes")
            n *= d
        total += n
    return total


def _stack(frames) -> tuple[str, str]:
    """(the stack as traceback.format_list writes it, innermost frame last; the innermost frame)."""
    if not isinstance(frames, list | tuple):
        return "", ""
    kept = [f for f in frames[:MAX_STACK_FRAMES] if isinstance(f, dict)]
    kept.reverse()  # Flight Recorder lists the innermost first
    text = "".join(f'  File "{f.get("filename")}", line {f.get("line")}, in {f.get("name")}\n' for f in kept)
    inner = kept[-1] if kept else None
    return text, f"{inner.get('filename')}:{inner.get('line')} in {inner.get('name')}" if inner else ""


def _call(group, name, is_p2p, world_names: set[str]) -> tuple:
    """What an entry's group and op name say: (group key, group label, op, p2p pair, the keys of the side
    that holds its size: dtypes, sizes); raises BadEntry. The same few calls repeat in every entry of a
    dump: ``_entry`` keeps these."""
    if not isinstance(group, list | tuple) or not group or not all(isinstance(g, str | int) for g in group):
        raise BadEntry(f"'process_group' is {str(group)[:40]!r}, not [name, desc]")
    pg, desc = str(group[0]), str(group[1]) if len(group) > 1 else ""
    key = _WORLD if desc == base.WORLD_DESC or pg in world_names else pg
    if not isinstance(name, str) or not name:
        raise BadEntry(f"'profiling_name' is {str(name)[:40]!r}, not an op's name")
    fr_op, _, between = name.split(":", 1)[-1].partition(" ")
    op = OPS.get(fr_op, fr_op)
    p2p = _p2p(op, between) if is_p2p else None
    side = "output" if op in _OUTPUT_SIDE else "input"
    return key, f"{pg} ({desc})" if desc else pg, op, p2p, f"{side}_dtypes", f"{side}_sizes"


_PLAIN = (int, type(None))  # a number field as torch writes it: no conversion, no check


def _entry(i: int, e, world_names: set[str], calls: dict | None = None) -> Entry | None:
    """The entry; raises BadEntry naming the field that is wrong. ``calls``: ``_call``'s answers so far."""
    if not isinstance(e, dict):
        raise BadEntry(f"is a {type(e).__name__}, not a map")
    group, name, is_p2p = e.get("process_group"), e.get("profiling_name"), e.get("is_p2p")
    memo = call = None
    if calls is not None and type(group) in (tuple, list) and len(group) == 2 and type(name) is str:
        if type(group[0]) is str and type(group[1]) is str:  # as torch writes them; anything else: worked out
            memo = (group[0], group[1], name, not is_p2p)
            call = calls.get(memo)
    if call is None:
        call = _call(group, name, is_p2p, world_names)
        if memo is not None:
            calls[memo] = call
    key, pg_label, op, p2p, dtypes_key, sizes_key = call
    seq = _int(e, "collective_seq_id")
    if seq is None or seq < 0:
        raise BadEntry("'collective_seq_id' is missing")
    dtypes = e.get(dtypes_key)
    first = dtypes[0] if isinstance(dtypes, list | tuple) and dtypes and isinstance(dtypes[0], str) else None
    dtype, itemsize = DTYPES.get(first, (first, None))
    numel = 0 if op == "barrier" else _elements(e.get(sizes_key), sizes_key)
    thread_id = e.get("thread_id")
    state = e.get("state")
    started, completed = e.get("time_discovered_started_ns"), e.get("time_discovered_completed_ns")
    created, timeout_ms = e.get("time_created_ns"), e.get("timeout_ms")
    if not (type(started) in _PLAIN and type(completed) in _PLAIN and type(created) in _PLAIN):
        started, completed = _int(e, "time_discovered_started_ns"), _int(e, "time_discovered_completed_ns")
        created = _int(e, "time_created_ns")
    if type(timeout_ms) not in _PLAIN:
        timeout_ms = _int(e, "timeout_ms")
    return Entry(
        index=i,
        pg=key,
        pg_label=pg_label,
        seq=seq,
        op=op,
        dtype=dtype,
        numel=numel,
        bytes=numel * itemsize if itemsize else None,
        state=state if isinstance(state, str) else "",
        start_ns=started or None,
        end_ns=completed or None,
        created_ns=created or None,
        timeout_s=(timeout_ms or 0) / 1000,
        thread_name=e.get("thread_name") if isinstance(e.get("thread_name"), str) else None,
        thread_id=int(thread_id) if str(thread_id or "").isdigit() and len(str(thread_id)) < 19 else None,
        frames=e.get("frames"),
        p2p=p2p,
    )


def _p2p(op: str, between: str) -> tuple[int, int]:
    """'send 0->1' / 'recv 1<-0' (NCCL's names, ranks as the group numbers them) -> (source, destination)."""
    try:
        if op == "send":
            src, dst = between.split("->")
        elif op == "recv":
            dst, src = between.split("<-")
        else:
            raise ValueError
        return int(src), int(dst)
    except ValueError:
        raise BadEntry(f"'profiling_name' is {op} {between[:40]!r}: no 'send a->b' or 'recv b<-a'") from None


def parse(path: Path) -> Parsed:
    """One rank's dump, read and checked; its rows are made by ``settle`` once every dump is read."""
    out = Parsed(sources=[str(path)])
    try:
        dump = _load(path)
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, RecursionError) as exc:
        out.problem(path, "", f"not a readable Flight Recorder dump ({exc}); skipped")
        return out
    if dump is None:
        out.problem(path, "", "not a Flight Recorder dump (no 'entries' and 'pg_config'); skipped")
        return out
    rank = _rank_of(path, dump)
    if rank is None:
        out.problem(path, "", "cannot tell which rank wrote this dump: name it <anything><rank> (fr3.json)")
        return out
    if not 0 <= rank < MAX_WORLD_SIZE:
        out.problem(path, "", f"rank {rank} is out of range (0 to {MAX_WORLD_SIZE - 1:,}); skipped")
        return out
    entries = dump.get("entries")
    if not isinstance(entries, list | tuple):
        out.problem(path, "entries", f"is a {type(entries).__name__}, not a list; skipped")
        return out
    stated, world_names = _stated_groups(dump, out, path)
    read = Dump(str(path), rank, stated, dumped_ns=path.stat().st_mtime_ns)
    calls: dict = {}
    for i, e in enumerate(entries):
        try:
            entry = _entry(i, e, world_names, calls)
        except BadEntry as exc:
            out.problem(path, f"entry {i}", f"{exc}; entry skipped")
            continue
        read.entries.append(entry)
        read.tracked |= entry.state in _TRACKED_STATES or entry.start_ns is not None
    out.hints[NAME] = read
    return out


# -- across every rank's dump -------------------------------------------------------------------


def _memberships(dumps: list[Dump], notes: list[str], roles: dict[str, str]) -> dict[str, list[int]]:
    """Group key -> members: where a dump states them, else inferred (and noted); ``roles`` gets
    each group's description as its entries name it."""
    members: dict[str, list[int]] = {}
    for d in dumps:
        for key, ranks in d.stated.items():
            if key in members and members[key] != ranks:
                notes.append(
                    f"{d.path}: process group {_label(key)} lists ranks {rank_ranges(ranks)}, another dump "
                    f"{rank_ranges(members[key])}; the first kept"
                )
            members.setdefault(key, ranks)
    holders: dict[str, set[int]] = {}
    labels: dict[str, str] = {}
    for d in dumps:
        for e in d.entries:
            holders.setdefault(e.pg, set()).add(d.rank)
            if e.pg not in labels:
                labels[e.pg] = e.pg_label
                roles[e.pg] = e.pg_label.partition(" (")[2].removesuffix(")")
    if _WORLD not in members:
        named = {r for ranks in members.values() for r in ranks} | {d.rank for d in dumps}
        members[_WORLD] = list(range(max(named) + 1)) if named else []
        if _WORLD in holders:
            notes.append(
                f"the default group's members are listed by no dump (gloo lists none): taken as ranks "
                f"{rank_ranges(members[_WORLD])}, up to the highest rank that left a dump or is named in one"
            )
    for key, ranks in sorted(holders.items()):
        if key not in members:
            members[key] = sorted(ranks)
            notes.append(
                f"process group {labels[key]}: no dump lists its members (gloo's pg_config holds only the default "
                f"group); taken as the ranks whose dumps hold its entries: {rank_ranges(members[key])}"
            )
    return members


def _label(key: str) -> str:
    return "default_pg" if key == _WORLD else key


def settle(parsed: list[Parsed]) -> list[str]:
    """Every dump's rows, decided across the ranks of one import; returns the import's notes
    (memberships inferred, ranks without a dump)."""
    notes: list[str] = []
    dumps: dict[int, tuple[Parsed, Dump]] = {}
    for p in parsed:
        d = p.hints.pop(NAME, None)
        if d is None:
            continue
        if d.rank in dumps:  # a rank dumped twice (JSON and pickle): the first file read is kept
            notes.append(f"{d.path}: rank {d.rank}'s dump is also in {dumps[d.rank][1].path}; the second not imported")
            continue
        dumps[d.rank] = (p, d)
    if not dumps:
        return notes
    roles: dict[str, str] = {}
    members = _memberships([d for _, d in dumps.values()], notes, roles)
    names = base.group_names(members, _WORLD, roles)
    entered: dict[tuple[str, int], int] = {}  # (group, rank) -> the highest seq it entered
    for _, d in dumps.values():
        for e in d.entries:
            if e.p2p is None:
                entered[(e.pg, d.rank)] = max(entered.get((e.pg, d.rank), 0), e.seq)
    without_dump = sorted({r for ranks in members.values() for r in ranks} - dumps.keys())
    if without_dump:
        notes.append(
            f"no dump from rank{'s' if len(without_dump) > 1 else ''} {rank_ranges(without_dump)}: judged on the "
            "ranks that left one; in a group known to hold them, a collective counts as joined by them only where a "
            "rank with a dump went on past it"
        )
    world = max((max(m) + 1 for m in members.values() if m), default=0)
    next(iter(dumps.values()))[0].hints[WITHOUT_DUMP] = without_dump
    seen = _Across(members, names, entered, set(dumps))
    p2p = {(d.rank, *k): n for _, d in dumps.values() for k, n in _p2p_counts(d, members).items()}
    for p, d in dumps.values():
        p.world_size = world or None
        _rows(p, d, seen)
        _p2p_rows(p, d, members, p2p, set(dumps))
    return notes


@dataclass
class _Across:
    """What one import's dumps say together, for deciding each entry."""

    members: dict[str, list[int]]  # group -> member ranks
    names: dict[str, str]  # group -> rankscope's group name
    entered: dict[tuple[str, int], int]  # (group, rank) -> the highest seq that rank entered
    dumped: set[int]  # ranks that left a dump
    furthest: dict[str, int] = field(default_factory=dict)  # group -> the highest seq a rank with a dump entered
    slowest: dict[str, int] = field(default_factory=dict)  # group -> the lowest of its dumped members' highest
    undumped: set[str] = field(default_factory=set)  # groups with a member that left no dump
    labels: dict[str, str] = field(default_factory=dict)  # group -> its members as rank_ranges writes them
    _absent: dict[tuple[str, int], list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # once per group, not per entry: a world group's members are as many as the job's ranks
        for (pg, _), seq in self.entered.items():
            self.furthest[pg] = max(self.furthest.get(pg, 0), seq)
        for pg, ranks in self.members.items():
            self.slowest[pg] = min((self.entered.get((pg, m), 0) for m in ranks if m in self.dumped), default=0)
            if not self.dumped.issuperset(ranks):
                self.undumped.add(pg)

    def label(self, pg: str) -> str:
        if pg not in self.labels:
            self.labels[pg] = rank_ranges(self.members.get(pg, []))
        return self.labels[pg]

    def absent(self, pg: str, seq: int) -> list[int]:
        """Members with a dump that never entered ``seq`` of ``pg`` (worked out once per collective)."""
        if self.slowest.get(pg, 0) >= seq:  # most entries: every member went at least this far
            return []
        key = (pg, seq)
        if key not in self._absent:
            self._absent[key] = [
                m for m in self.members.get(pg, []) if m in self.dumped and self.entered.get((pg, m), 0) < seq
            ]
        return self._absent[key]


def _rows(p: Parsed, d: Dump, seen: _Across) -> None:
    """``d``'s entries as comm, inflight and stacks rows of ``p``."""
    newest, stuck = None, set()
    for e in d.entries:
        if newest is None or (e.created_ns or 0) >= (newest.created_ns or 0):
            newest = e
        if e.p2p is not None:  # its rows: _p2p_rows
            if e.state != "completed":
                stuck.add(e.index)
            continue
        where = f"entry {e.index}"
        group_members = seen.members.get(e.pg, [])
        row = dict(
            step=None,
            group_name=seen.names[e.pg],
            group_size=len(group_members),
            seq=e.seq,
            op=e.op,
            dtype=e.dtype,
            numel=e.numel,
            bytes=e.bytes,
        )
        absent = seen.absent(e.pg, e.seq)
        if d.tracked:
            done = e.state == "completed"
        else:  # a member without a dump joined it only if a rank with one went on past it
            unconfirmed = seen.furthest.get(e.pg, 0) <= e.seq and e.pg in seen.undumped
            done = not absent and not unconfirmed
        if done:
            start = e.start_ns if d.tracked else e.created_ns
            p.add("comm", d.rank, where, **row, log_name=e.op, start_ns=start, end_ns=e.end_ns, async_op=None)
            continue
        p.add(
            "inflight",
            d.rank,
            where,
            **row,
            group_ranks=seen.label(e.pg),
            entered_ns=e.created_ns or d.dumped_ns,
            time_ns=d.dumped_ns,
            # written after the fact, a dump shows a member that never entered it (or one without a dump that
            # nobody saw go past it) as it will stay: hung at once; every member in it and running: its timeout
            hang_after_s=0.0 if absent or not d.tracked else e.timeout_s,
            state="waiting",
        )
        _stack_row(p, d, e, f"in flight: {e.op} #{e.seq} of {seen.names[e.pg]} (Flight Recorder)")
        stuck.add(e.index)
    if newest is not None and newest.index not in stuck:
        _stack_row(p, d, newest, f"last seen: {newest.op} #{newest.seq} of {seen.names[newest.pg]} (Flight Recorder)")


def _global(members: dict[str, list[int]], e: Entry) -> tuple[int, int] | None:
    ranks = members.get(e.pg, [])
    src, dst = e.p2p
    return (ranks[src], ranks[dst]) if 0 <= src < len(ranks) and 0 <= dst < len(ranks) else None


def _p2p_counts(d: Dump, members) -> dict[tuple[str, int, int], int]:
    """(op, source, destination) -> how many of them this rank issued."""
    counts: dict[tuple[str, int, int], int] = {}
    for e in d.entries:
        pair = _global(members, e) if e.p2p else None
        if pair:
            counts[(e.op, *pair)] = counts.get((e.op, *pair), 0) + 1
    return counts


def _p2p_rows(p: Parsed, d: Dump, members, issued: dict, dumped: set[int]) -> None:
    """Sends and recvs, as the hook records them: group ``p2p[src->dst]``, ``seq`` counted per direction
    (the n-th send from src to dst matches the n-th recv there). Done where the state says so (NCCL);
    otherwise in flight, hung at once when the peer (with a dump) never issued its side."""
    count: dict[tuple[str, int, int], int] = {}
    for e in d.entries:
        pair = _global(members, e) if e.p2p else None
        if pair is None:
            if e.p2p:
                p.problem(
                    d.path,
                    f"entry {e.index}",
                    f"{e.op} between group ranks {e.p2p} of a group of {len(members.get(e.pg, []))}; entry skipped",
                )
            continue
        seq = count[(e.op, *pair)] = count.get((e.op, *pair), 0) + 1
        row = dict(
            step=None,
            group_name=f"p2p[{pair[0]}->{pair[1]}]",
            group_size=2,
            seq=seq,
            op=e.op,
            dtype=e.dtype,
            numel=e.numel,
            bytes=e.bytes,
        )
        if e.state == "completed":
            p.add(
                "comm",
                d.rank,
                f"entry {e.index}",
                **row,
                log_name=e.op,
                start_ns=e.start_ns,
                end_ns=e.end_ns,
                async_op=None,
            )
            continue
        peer = pair[1] if e.op == "send" else pair[0]
        other = "recv" if e.op == "send" else "send"
        absent = peer in dumped and issued.get((peer, other, *pair), 0) < seq
        p.add(
            "inflight",
            d.rank,
            f"entry {e.index}",
            **row,
            group_ranks=rank_ranges(sorted(pair)),
            entered_ns=e.created_ns or d.dumped_ns,
            time_ns=d.dumped_ns,
            hang_after_s=0.0 if absent else e.timeout_s,
            state="waiting",
        )
        _stack_row(p, d, e, f"in flight: {e.op} #{seq} of p2p[{pair[0]}->{pair[1]}] (Flight Recorder)")


def _stack_row(p: Parsed, d: Dump, e: Entry, reason: str) -> None:
    stack, innermost = _stack(e.frames)
    if not stack:
        return
    p.add(
        "stacks",
        d.rank,
        f"entry {e.index}",
        step=None,
        reason=reason,
        thread_name=e.thread_name,
        thread_id=e.thread_id,
        is_main=None,
        stack=stack,
        innermost=innermost,
        time_ns=d.dumped_ns,
    )
