"""A corpus of real Flight Recorder dumps: gloo jobs that hang, desync or crash in the ways jobs do,
each case a folder of torch's own per-rank dumps, for `rankscope import`/`fr` and torch's analyzer.

    python -m collector.testing.flight_recorder_corpus OUT    # ~30 s of CPU (10 ranks' processes)

Two launches of real ranks (torch.distributed on gloo, torch 2.13, ``TORCH_FR_BUFFER_SIZE`` set)
run every case one after the other, each case on process groups of its own, and write after each
case every rank's dump. One launch runs several cases to keep the corpus cheap: torch has no way to
clear its Flight Recorder, so a case's dump is the process's dump with only the entries of that
case's groups kept (each entry as torch wrote it but its ``record_id``, counted from the case's first
entry as in a job that ran only that case; ``pg_config`` and the rest untouched). Ranks meet
between cases through the rendezvous store, which Flight Recorder does not record.

Each case folder holds:

- ``dumps/``: the dumps, named as jobs name them (``nccl_trace_rank_<r>``, the default
  ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``; a custom prefix; host names), pickles (``_dump_fr_trace``,
  with stacks) and JSON (``_dump_fr_trace_json``, torch 2.13 writes no stacks in it);
- ``fr_trace/``: the same dumps as ``rank_<r>`` pickles whose ``pg_config`` lists every group of
  the rank with its members, as NCCL's dumps do. torch's analyzer cannot read gloo's own dumps (their
  ``pg_config`` lists only the default group, with no ranks; it stops with a KeyError), so this is
  what it is given -- the entries are the same;
- ``case.json``: what was done (``fault``, the group's ``members``, the ``op``, the ``missing`` ranks
  or ``mismatched`` ones), and ``fr_trace_args`` (``--allow-incomplete-ranks`` where dumps are missing).

Not covered by gloo: p2p (gloo's Flight Recorder records no send/recv) and NCCL's tracked states.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import shutil
import sys
import time
from pathlib import Path

FAULT_TIMEOUT_S = 10  # a desync's or a crash's group times out after this (gloo may abort or raise sooner)
WORLD_TIMEOUT_S = 60  # the default group's: its rendezvous waits this long for ranks that start late under load
SAFE_TIMEOUT = 120  # the healthy groups' timeout: never reached
SYNC_TIMEOUT_S = 120


# -- inside a rank ------------------------------------------------------------------------------


class _Rank:
    """One rank of a launch: its case bookkeeping, dumps, and the store-based meeting point."""

    def __init__(self, rank: int, world: int, out: Path):
        import torch.distributed as dist

        self.rank, self.world, self.out = rank, world, out
        self.dist = dist
        self.store = dist.distributed_c10d._get_default_store()
        self.case = ""
        self.pgs: dict[str, dict] = {}  # this case's groups this rank is in: pg name -> {desc, ranks}

    def begin(self, case: str) -> None:
        import torch

        self.case, self.pgs = case, {}
        # the record ids this process used before the case: a case's dump counts from where the case began,
        # as a job that ran only this case would (fr_trace aligns ranks by their first record id)
        entries = pickle.loads(torch._C._distributed_c10d._dump_fr_trace(True, False, False)).get("entries", [])
        self.first_record = max((e["record_id"] + 1 for e in entries), default=0)
        if self.rank == 0:
            (self.out / case / "dumps").mkdir(parents=True, exist_ok=True)
            (self.out / case / "fr_trace").mkdir(parents=True, exist_ok=True)
        self.meet(f"begin-{case}")

    def group(self, ranks: list[int], *, faulty: bool = False):
        """A new group of ``ranks`` (every rank calls it); noted for this case's dumps if this rank is in it."""
        timeout = datetime.timedelta(seconds=FAULT_TIMEOUT_S if faulty else SAFE_TIMEOUT)
        pg = self.dist.new_group(ranks, timeout=timeout)
        self._note(pg, ranks)
        return pg

    def subgroups(self, size: int, *, faulty: bool = False):
        timeout = datetime.timedelta(seconds=FAULT_TIMEOUT_S if faulty else SAFE_TIMEOUT)
        mine, every = self.dist.new_subgroups(group_size=size, timeout=timeout)
        self._note(mine, self.dist.get_process_group_ranks(mine))
        return mine, every

    def world_group(self):
        pg = self.dist.group.WORLD
        self._note(pg, list(range(self.world)))
        return pg

    def _note(self, pg, ranks) -> None:
        if pg is not None and pg is not self.dist.GroupMember.NON_GROUP_MEMBER:
            desc = getattr(pg, "group_desc", "") or ("default_pg" if pg is self.dist.group.WORLD else "undefined")
            self.pgs[str(pg.group_name)] = {"desc": desc, "ranks": str(sorted(ranks))}

    def meet(self, name: str) -> None:
        """Every rank of the launch gets here (through the store: no collective, no Flight Recorder entry)."""
        self.store.add(name, 1)
        deadline = time.monotonic() + SYNC_TIMEOUT_S
        while int(self.store.add(name, 0)) < self.world:
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {self.rank}: the other ranks never reached {name}")
            time.sleep(0.02)

    def wait_for_dumps(self, ranks: list[int]) -> None:
        """A rank that hangs its peers stays alive until they have dumped (its leaving would end their wait)."""
        deadline = time.monotonic() + SYNC_TIMEOUT_S
        for r in ranks:
            while not (self.out / self.case / "fr_trace" / f"rank_{r}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)

    def stall(self, pg, seq: int, collective, culprits: list[int], name: str, *, as_json: bool = False) -> None:
        """A hang, as a watchdog sees it: the members but ``culprits`` enter ``collective`` (seq ``seq`` of
        ``pg``) and a thread of theirs dumps while they wait in it; the culprits dump once they have,
        without having entered it, and only then join, so the group finishes it and lives on."""
        import threading

        members = self.dist.get_process_group_ranks(pg)
        if self.rank in culprits:
            self.wait_for_dumps([m for m in members if m not in culprits])
            self.dump(name, as_json=as_json)
            collective()
            return
        dumper = threading.Thread(target=self._dump_once_in, args=(str(pg.group_name), seq, name, as_json))
        dumper.start()
        collective()
        dumper.join()

    def mismatch(self, pg, seq: int, right, wrong, culprits: list[int], name: str) -> None:
        """A desync: the members but ``culprits`` enter ``right()`` (seq ``seq`` of ``pg``) and dump while
        they wait in it; then the culprits call ``wrong()`` (async: its entry is made at once) and dump.
        gloo may abort a process on the data that follows, so this is a launch's last case."""
        import threading

        members = self.dist.get_process_group_ranks(pg)
        if self.rank in culprits:
            self.wait_for_dumps([m for m in members if m not in culprits])
            work = wrong()
            self.dump(name)
            _try(lambda: work.wait())
            return
        dumper = threading.Thread(target=self._dump_once_in, args=(str(pg.group_name), seq, name, False))
        dumper.start()
        _try(right)
        dumper.join()

    def _dump_once_in(self, pg_name: str, seq: int, name: str, as_json: bool) -> None:
        import torch

        deadline = time.monotonic() + SYNC_TIMEOUT_S
        while time.monotonic() < deadline:
            entries = pickle.loads(torch._C._distributed_c10d._dump_fr_trace(True, False, False))["entries"]
            if any(str(e["process_group"][0]) == pg_name and e["collective_seq_id"] >= seq for e in entries):
                break
            time.sleep(0.02)
        time.sleep(0.2)  # waited a while in it, as a watchdog's dump comes after a wait
        self.dump(name, as_json=as_json)

    def dump(self, name: str, *, as_json: bool = False) -> None:
        """This rank's dump of this case, to dumps/<name> (pickle or JSON) and fr_trace/rank_<r>."""
        import torch

        c10d = torch._C._distributed_c10d
        data = pickle.loads(c10d._dump_fr_trace(True, True, False))
        keep = [self._renumbered(e) for e in data.get("entries", []) if str(e["process_group"][0]) in self.pgs]
        case = self.out / self.case
        if as_json:
            raw = json.loads(c10d._dump_fr_trace_json(True, False))
            raw["entries"] = [
                self._renumbered(e) for e in raw.get("entries", []) if str(e["process_group"][0]) in self.pgs
            ]
            _write(case / "dumps" / name, json.dumps(raw).encode())
        else:
            _write(case / "dumps" / name, pickle.dumps(dict(data, entries=keep)))
        for_analyzer = dict(data, entries=keep, pg_config=self.pgs, rank=self.rank)
        _write(case / "fr_trace" / f"rank_{self.rank}", pickle.dumps(for_analyzer))

    def _renumbered(self, e: dict) -> dict:
        return dict(e, record_id=e["record_id"] - self.first_record)


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.rename(path)


def _describe(out: Path, case: str, **facts) -> None:
    (out / case / "case.json").write_text(json.dumps(facts, indent=1) + "\n")


def _try(fn) -> str | None:
    """Runs a collective a peer never joins: it raises once the group times out (or the peer left)."""
    try:
        fn()
    except RuntimeError as exc:
        return str(exc)[:200]
    return None


def _ops(pg, t, rounds: int = 2) -> None:
    """A training step's collectives on ``pg``: all_reduce, all_gather_into_tensor, reduce_scatter_tensor,
    broadcast."""
    import torch
    import torch.distributed as dist

    n = dist.get_world_size(pg)
    for _ in range(rounds):
        dist.all_reduce(t, group=pg)
        dist.all_gather_into_tensor(torch.zeros(t.numel() * n), t, group=pg)
        dist.reduce_scatter_tensor(torch.zeros(t.numel() // n), t, group=pg)
        dist.broadcast(t, src=dist.get_global_rank(pg, 0), group=pg)


def _main_launch(rank: int, port: int, out: str) -> None:
    """4 ranks: healthy, hangs in subgroups (new_group, new_subgroups, a DP group of a TP x DP
    layout), mismatched sizes and ops, and last a hang of the default group."""
    import torch
    import torch.distributed as dist

    from collector.testing.gloo import torchrun_env

    torchrun_env(rank, 4, port, TORCH_FR_BUFFER_SIZE="2000")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=WORLD_TIMEOUT_S))
    r, out_dir = _Rank(rank, 4, Path(out)), Path(out)
    t = torch.ones(8)

    r.begin("healthy")
    _ops(r.group([0, 1, 2, 3]), t)
    mine, _ = r.subgroups(2)
    _ops(mine, t)
    dist.barrier(group=mine)
    r.dump(f"fr{rank}.json", as_json=True)
    if rank == 0:
        _describe(out_dir, "healthy", fault="none")

    r.begin("subgroup_hang")  # new_group([0, 1, 2]): rank 2 has not entered the 3rd all_reduce
    g = r.group([0, 1, 2])
    if rank in (0, 1, 2):
        dist.all_reduce(t, group=g)
        dist.all_reduce(t, group=g)
        r.stall(g, 3, lambda: dist.all_reduce(t, group=g), [2], f"nccl_trace_rank_{rank}")
    else:
        r.dump(f"nccl_trace_rank_{rank}")
    if rank == 0:
        _describe(out_dir, "subgroup_hang", fault="hang", members=[0, 1, 2], seq=3, op="all_reduce", missing=[2])

    r.begin("new_subgroups_hang")  # new_subgroups(2): rank 3 has not entered its pair's 2nd all_gather
    mine, _ = r.subgroups(2)
    dist.all_reduce(t, group=mine)
    dist.all_gather_into_tensor(torch.zeros(16), t, group=mine)
    name = f"trainer-{rank // 2}.cluster.local_rank{rank}"  # host names in the file names
    r.stall(mine, 3, lambda: dist.all_gather_into_tensor(torch.zeros(16), t, group=mine), [3], name)
    if rank == 0:
        _describe(out_dir, "new_subgroups_hang", fault="hang", members=[2, 3], seq=3, op="all_gather", missing=[3])

    r.begin("dp_group_hang")  # TP pairs [0,1] [2,3], DP pairs [0,2] [1,3]: rank 3 late to a DP all_reduce
    tp = [r.group([0, 1]), r.group([2, 3])][rank // 2]
    dp = [r.group([0, 2]), r.group([1, 3])][rank % 2]
    name = f"job42_fr_{rank}"  # a TORCH_NCCL_DEBUG_INFO_TEMP_FILE prefix of the job's own
    for _ in range(2):
        dist.all_reduce(t, group=tp)
        dist.all_reduce(t, group=dp)
    dist.all_reduce(t, group=tp)
    r.stall(dp, 3, lambda: dist.all_reduce(t, group=dp), [3] if rank % 2 else [], name)
    if rank == 0:
        _describe(out_dir, "dp_group_hang", fault="hang", members=[1, 3], seq=3, op="all_reduce", missing=[3])

    r.begin("world_hang")  # the default group: rank 2 has not entered step 3's all_reduce
    w = r.world_group()
    for _ in range(2):
        dist.all_reduce(t, group=w)
        dist.all_gather_into_tensor(torch.zeros(32), t, group=w)
    r.stall(w, 5, lambda: dist.all_reduce(t, group=w), [2], f"nccl_trace_rank_{rank}")
    if rank == 0:
        _describe(
            out_dir,
            "world_hang",
            fault="hang",
            group="world",
            members=[0, 1, 2, 3],
            seq=5,
            op="all_reduce",
            missing=[2],
        )

    r.begin("op_mismatch")  # rank 3 broadcasts where the others all_reduce
    g = r.group([0, 1, 2, 3], faulty=True)
    dist.all_reduce(t, group=g)
    if rank == 0:
        _describe(
            out_dir, "op_mismatch", fault="op_mismatch", members=[0, 1, 2, 3], seq=2, op="all_reduce", mismatched=[3]
        )
    r.mismatch(
        g,
        2,
        lambda: dist.all_reduce(t, group=g),
        lambda: dist.broadcast(t, src=0, group=g, async_op=True),
        [3],
        f"nccl_trace_rank_{rank}",
    )
    sys.stdout.flush()
    os._exit(0)  # gloo's pairs of the faulty groups are broken: no clean teardown


def _ring_launch(rank: int, port: int, out: str) -> None:
    """3 ranks, a 16-entry ring: a hang after the ring wrapped, then a rank that crashes."""
    import torch
    import torch.distributed as dist

    from collector.testing.gloo import torchrun_env

    torchrun_env(rank, 3, port, TORCH_FR_BUFFER_SIZE="16")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=WORLD_TIMEOUT_S))
    r, out_dir = _Rank(rank, 3, Path(out)), Path(out)
    t = torch.ones(8)

    r.begin("wrapped_ring_hang")  # 40 all_reduces through a 16-entry ring, then rank 2 late to the 41st
    g = r.group([0, 1, 2])
    for _ in range(40):
        dist.all_reduce(t, group=g)
    r.stall(g, 41, lambda: dist.all_reduce(t, group=g), [2], f"nccl_trace_rank_{rank}")
    if rank == 0:
        _describe(out_dir, "wrapped_ring_hang", fault="hang", members=[0, 1, 2], seq=41, op="all_reduce", missing=[2])

    r.begin("crashed_rank")  # rank 1 dies (no dump) before its 3rd all_reduce; the others wait in it
    g = r.group([0, 1, 2], faulty=True)
    dist.all_reduce(t, group=g)
    dist.all_reduce(t, group=g)
    if rank == 1:
        sys.stdout.flush()
        os._exit(17)
    _try(lambda: dist.all_reduce(t, group=g))
    r.dump(f"nccl_trace_rank_{rank}")
    if rank == 0:
        _describe(
            out_dir,
            "crashed_rank",
            fault="crash",
            members=[0, 1, 2],
            seq=3,
            op="all_reduce",
            missing=[1],
            fr_trace_args=["--allow-incomplete-ranks"],
        )
    os._exit(0)


def _mismatch_launch(rank: int, port: int, out: str) -> None:
    """3 ranks: rank 1 all_reduces 16 elements where the others do 8 (gloo aborts a receiver on it)."""
    import torch
    import torch.distributed as dist

    from collector.testing.gloo import torchrun_env

    torchrun_env(rank, 3, port, TORCH_FR_BUFFER_SIZE="2000")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=WORLD_TIMEOUT_S))
    r, out_dir = _Rank(rank, 3, Path(out)), Path(out)
    t = torch.ones(8)
    r.begin("size_mismatch")
    g = r.group([0, 1, 2], faulty=True)
    dist.all_reduce(t, group=g)
    if rank == 0:
        _describe(
            out_dir, "size_mismatch", fault="size_mismatch", members=[0, 1, 2], seq=2, op="all_reduce", mismatched=[1]
        )
    r.mismatch(
        g,
        2,
        lambda: dist.all_reduce(t, group=g),
        lambda: dist.all_reduce(torch.ones(16), group=g, async_op=True),
        [1],
        f"nccl_trace_rank_{rank}",
    )
    os._exit(0)


# -- the parent ---------------------------------------------------------------------------------

CASES = (
    "healthy",
    "subgroup_hang",
    "new_subgroups_hang",
    "dp_group_hang",
    "size_mismatch",
    "op_mismatch",
    "world_hang",
    "wrapped_ring_hang",
    "crashed_rank",
    "missing_dump",
)


def generate(out: str | os.PathLike, timeout: float = 300.0) -> Path:
    """Every case under ``out`` (made if needed); returns ``out``. Both launches run at once."""
    from collector.testing import gloo

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    launches = [
        (gloo.start_ranks(fn, n, str(out)), n)
        for fn, n in ((_main_launch, 4), (_ring_launch, 3), (_mismatch_launch, 3))
    ]
    deadline = time.monotonic() + timeout
    for ctx, _ in launches:
        while not _joined(ctx):
            if time.monotonic() > deadline:
                for c, _ in launches:
                    for p in c.processes:
                        p.kill()
                raise AssertionError(f"the corpus's ranks did not finish in {timeout:.0f} s")
    absent = [c for c in CASES[:-1] if not (out / c / "case.json").exists()]
    if absent:
        raise AssertionError(f"the corpus's ranks exited without writing {', '.join(absent)} (see their stderr above)")
    _missing_dump(out)
    return out


def _joined(ctx) -> bool:
    """Whether every rank exited (a rank's non-zero exit is the crashed_rank case's, not a failure)."""
    for p in ctx.processes:
        p.join(timeout=0.2)
    return all(p.exitcode is not None for p in ctx.processes)


def _missing_dump(out: Path) -> None:
    """subgroup_hang without the dump of its rank that never arrived (a job whose stuck rank wrote nothing)."""
    src, dst = out / "subgroup_hang", out / "missing_dump"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    (dst / "dumps" / "nccl_trace_rank_2").unlink()
    (dst / "fr_trace" / "rank_2").unlink()
    facts = json.loads((src / "case.json").read_text())
    _describe(out, "missing_dump", **dict(facts, fault="hang", fr_trace_args=["--allow-incomplete-ranks"]))


# -- torch's analyzer, as the reference ---------------------------------------------------------

_HEADERS = {
    "Not all ranks joining collective, sequence number:": "hang",
    "Collective sequence number:": "mismatch",
}


def analyzer_verdicts(case: str | os.PathLike) -> list[dict]:
    """What torch's analyzer says about a case's ``fr_trace/`` dumps (see fr_trace_verdicts)."""
    case = Path(case)
    facts = json.loads((case / "case.json").read_text())
    return fr_trace_verdicts(case / "fr_trace", "rank_", *facts.get("fr_trace_args", []))


def fr_trace_verdicts(dumps: str | os.PathLike, prefix: str, *args: str) -> list[dict]:
    """What ``python -m torch.distributed.flight_recorder.fr_trace DUMPS -p PREFIX ARGS`` says, run in
    this process (its verdicts go to its logger): one dict per problem, ``kind`` "hang" (``seq``,
    ``op``, ``expected`` and ``missing`` ranks), "mismatch" (``seq``, ``expected``, ``culprits``,
    ``error``) or "missing_dumps" (``ranks``)."""
    import contextlib
    import io
    import logging

    from torch.distributed.flight_recorder import fr_trace

    said = io.StringIO()
    logger = logging.getLogger("Flight Recorder")
    own = logger.handlers[:]  # its handler writes to the stderr of when it was made: heard here instead
    logger.handlers = [logging.StreamHandler(said)]
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            fr_trace.main([str(dumps), "-p", prefix, *args])
    finally:
        logger.handlers = own
    return parse_analyzer_output(said.getvalue())


def _ranks(text: str) -> list[int]:
    return sorted(int(r) for r in text.strip().strip("(){}").split(",") if r.strip())


def parse_analyzer_output(text: str) -> list[dict]:
    verdicts: list[dict] = []
    missing_dumps: set[int] = set()
    for line in text.splitlines():
        line = line.strip()
        header = next((h for h in _HEADERS if line.startswith(h)), None)
        if header:
            verdicts.append({"kind": _HEADERS[header], "seq": int(line[len(header) :].split()[0])})
        elif "missed FR dumps from ranks" in line:
            missing_dumps.update(_ranks(line.split("from ranks", 1)[1].split(")", 1)[0]))
        elif verdicts and ": " in line:
            key, value = line.split(": ", 1)
            v = verdicts[-1]
            if key == "collective":
                v["op"] = value.split(":", 1)[-1]
            elif key in ("missing ranks", "expected ranks"):
                v[key.split()[0]] = _ranks(value)
            elif key == "error msg":
                v["error"] = value
                v["culprits"] = sorted({int(c.split(";")[0]) for c in value.split("Culprit rank ")[1:]})
    if missing_dumps:
        verdicts.append({"kind": "missing_dumps", "ranks": sorted(missing_dumps)})
    return verdicts


if __name__ == "__main__":
    started = time.monotonic()
    where = generate(sys.argv[1] if len(sys.argv) > 1 else "fr-corpus")
    print(f"{len(CASES)} cases in {where} ({time.monotonic() - started:.1f} s)")
