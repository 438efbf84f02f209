"""Added cost of recording a collective, ours vs DeepSpeed's comms logger: 4-element
float32 all_reduce on 2 gloo ranks. Target: ours <= 2 us median added per call and
<= 1/10 of what DeepSpeed's logger adds.

Four process pairs run side by side in one invocation, each started once and then
driven in lock-step rounds by this process (one pair works while the others wait on a
pipe, so they never compete for the cores), A/B order alternating every round:

  logger     rankscope venv: raw torch.distributed.distributed_c10d.all_reduce vs
             collector.rank.comm.all_reduce with comms_logger enabled, no telemetry session
             (record + background drain, nothing shipped)
  deferred   as logger, but the background drain is held off during the timed blocks and run
             between them (untimed): separates the training thread's own work from the drain
             thread's competition for the GIL and the cores
  attached   rankscope venv: raw vs torch.distributed.all_reduce patched by
             collector.hook.attach(), shipping every record over gRPC to a real collector
             started in this process
  deepspeed  .bench-venv-ds (benches/_deepspeed_venv.py): raw torch all_reduce vs
             deepspeed.comm.all_reduce with comms_logger disabled vs enabled (prof_all)

Per call: median of per-call wall times over all rounds; "added" is the difference of
medians (ours: hooked - raw; DeepSpeed's: logger on - logger off). The spread of the
per-round differences is reported too. Each pair also measures the isolated wrapper
cost: the same wrappers around a no-op collective (local, 1000-call loops), i.e. exactly
the work added on the training thread; rankscope's pairs time a few such loops every round
(untimed for the end-to-end figures), so they share the rounds' alternation too.

``--base COMMIT`` adds, for each rankscope pair, a pair running that commit's collector
package (exported with git archive, stubs generated; driven by this file's worker code) in
the same alternating rounds: a hot-path change measured before and after in one run.

    python -m benches.hook_overhead [--calls 300 --rounds 24] [--base COMMIT]
Writes benches/RESULTS-hook.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benches._common import code_version

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _pct(xs: list, q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


# ---------------------------------------------------------------------------
# workers: `python -m benches.hook_overhead --worker KIND RANK PORT OUT [ENDPOINT]`
# stdin: "round I" -> one block of --calls calls per variant, "end" -> isolated + results


def _serve(
    rank: int, variants: dict, calls: int, isolated, out: Path, finish=None, after_block=None, each_round=None
) -> None:
    """Lock-step loop shared by every worker kind. ``variants``: name -> fn(tensor); ``isolated(t)``
    at the end, ``each_round(t)`` after each round's timed blocks (both untimed for those)."""
    import torch
    import torch.distributed.distributed_c10d as c10d

    t = torch.ones(4)
    perf = time.perf_counter_ns
    for _ in range(200):  # warm up every path
        for fn in variants.values():
            fn(t)
    samples = {name: [] for name in variants}
    per_round = {name: [] for name in variants}
    names = list(variants)
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "end":
            break
        i = int(cmd[1])
        order = names[i % len(names) :] + names[: i % len(names)]  # rotate which path goes first
        for name in order:
            fn, sink = variants[name], []
            c10d.barrier()
            for _ in range(calls):
                t0 = perf()
                fn(t)
                sink.append(perf() - t0)
            samples[name] += sink
            per_round[name].append(statistics.median(sink) / 1e3)
            if after_block:
                after_block()  # untimed
        if each_round:
            each_round(t)
        print("done", flush=True)
    c10d.barrier()
    iso = isolated(t)
    c10d.barrier()
    extra = finish() if finish else {}
    out.write_text(
        json.dumps(
            {
                "median_us": {n: statistics.median(v) / 1e3 for n, v in samples.items()},
                "p90_us": {n: _pct(v, 0.9) / 1e3 for n, v in samples.items()},
                "per_round_us": per_round,
                "calls": {n: len(v) for n, v in samples.items()},
                "isolated_us": iso,
                **extra,
            }
        )
    )


def _time_blocks(fns: dict, t, blocks: int, n: int = 1000) -> dict[str, list[float]]:
    """us per call of each ``n``-call loop, ``blocks`` loops per function, interleaved."""
    perf = time.perf_counter_ns
    res = {name: [] for name in fns}
    for _ in range(blocks):
        for name, fn in fns.items():
            t0 = perf()
            for _ in range(n):
                fn(t)
            res[name].append((perf() - t0) / n / 1e3)
    return res


def _time_isolated(fns: dict, t, blocks: int = 50, n: int = 1000) -> dict:
    return {name: statistics.median(v) for name, v in _time_blocks(fns, t, blocks, n).items()}


def _method_call_wrapper(real):
    """The same-run "before": the all_reduce wrapper as it was generated before the recorder's
    enter/complete were inlined into it (two method calls around the real one)."""
    from collector.rank.recorder import REC

    def all_reduce(tensor, op=None, group=None, async_op=False, log_name=None):
        if not REC.on or ("all_reduce" not in REC.ops and log_name not in REC.ops):
            return real(tensor, op, group, async_op)
        span = None
        slot = REC.enter("all_reduce", group, tensor.dtype, tensor.numel(), 1)
        try:
            work = real(tensor, op, group, async_op)
        except BaseException:
            REC.abandon(slot)
            raise
        return REC.complete(slot, log_name, work if async_op else None, span)

    return all_reduce


def _ours(kind: str, rank: int, port: int, out: Path, calls: int, endpoint: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from collector import hook
    from collector.rank import comm, recorder

    if kind == "deferred":
        recorder.DRAIN_INTERVAL_S = 3600.0  # no background drain during a block: flushed between blocks instead
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    if kind == "attached":
        hook.attach(run="bench-hook-overhead", endpoint=endpoint)
        hooked = dist.all_reduce
        assert hooked is comm.all_reduce
    else:
        comm.configure({"enabled": True})
        hooked = comm.all_reduce
    raw = c10d.all_reduce

    def noop(tensor, op=None, group=None, async_op=False):
        return None

    # The wrapper binds the real function when it is generated: generate one around the no-op
    # (patching c10d afterwards would time a real gloo all_reduce without its peer's pace).
    from collector.rank.ops import SPECS, instrument

    c10d.all_reduce = noop
    try:
        wrapper = instrument(SPECS["all_reduce"])
    finally:
        c10d.all_reduce = raw
    local = {"no-op": noop, "wrapper": wrapper, "method calls": _method_call_wrapper(noop)}
    blocks = {name: [] for name in local}  # every round's 1000-call loops
    per_round = []  # each round's added cost: median wrapper loop - median no-op loop

    def each_round(t):
        got = _time_blocks(local, t, blocks=4)
        for name, v in got.items():
            blocks[name] += v
        per_round.append(statistics.median(got["wrapper"]) - statistics.median(got["no-op"]))

    def isolated(t):
        best = min(blocks["wrapper"]) - min(blocks["no-op"])  # the least-disturbed loops: the most sensitive figure
        return {name: statistics.median(v) for name, v in blocks.items()} | {"added per round": per_round, "best": best}

    def finish():
        left = comm.flush()
        if kind == "attached":
            hook.detach()
        import collector

        return {"recorded_left": left, "dropped": comm.dropped_records(), "package": collector.__file__}

    _serve(
        rank,
        {"raw": raw, kind: hooked},
        calls,
        isolated,
        out,
        finish,
        after_block=comm.flush if kind == "deferred" else None,
        each_round=each_round,
    )
    dist.destroy_process_group()


def _deepspeed(rank: int, port: int, out: Path, calls: int) -> None:
    import logging

    import deepspeed
    import deepspeed.comm as ds
    import torch
    import torch.distributed.distributed_c10d as c10d

    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    deepspeed.utils.logger.setLevel(logging.WARNING)
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    ds.configure(enabled=False, prof_all=True, verbose=False, debug=False)
    logger = ds.comms_logger

    def off(t):
        logger.enabled = False
        ds.all_reduce(t)

    def on(t):
        logger.enabled = True
        ds.all_reduce(t)
        logger.enabled = False  # leave it off for the other variants' calls (and the barriers)

    raw = c10d.all_reduce
    torch_mod = torch.distributed

    def isolated(t):
        def noop(tensor=None, op=None, group=None, async_op=False):
            return None

        logged_before = len(ds.timers("all_reduce").event_timers)
        ds.timers("all_reduce").reset()  # start from an empty timer: its cost grows with what it holds
        saved = torch_mod.all_reduce
        torch_mod.all_reduce = noop  # deepspeed.comm's TorchBackend calls torch.distributed.all_reduce
        perf = time.perf_counter_ns
        try:
            res = _time_isolated({"no-op": noop, "logger off": off}, t, blocks=20, n=500)
            blocks = []  # logger on, 500-call blocks from an empty timer to 10,000 logged calls
            for _ in range(20):
                t0 = perf()
                for _ in range(500):
                    on(t)
                blocks.append((perf() - t0) / 500 / 1e3)
        finally:
            torch_mod.all_reduce = saved
        return dict(
            res,
            **{
                "logger on": statistics.median(blocks),
                "on first 500": blocks[0],
                "on last 500": blocks[-1],
                "timer entries before reset": logged_before,
            },
        )

    def finish():
        logged = sum(v[0] for sizes in logger.comms_dict.values() for v in sizes.values())
        return {"versions": {"torch": torch.__version__, "deepspeed": deepspeed.__version__}, "logged": logged}

    _serve(rank, {"raw": raw, "ds logger off": off, "ds logger on": on}, calls, isolated, out, finish)
    ds.destroy_process_group()


class _Pair:
    """Two worker processes of one kind, driven in lock-step."""

    def __init__(
        self, kind: str, python: str, env: dict, out_dir: Path, calls: int, endpoint: str, root: Path = ROOT
    ) -> None:
        """``kind``: the worker's kind, "@base" appended for a pair running the --base tree at ``root``."""
        # Imported here, on the driver: DeepSpeed's venv, where some workers import this
        # module, has no grpc for collector.testing to load.
        from collector.testing.ports import free_port

        self.kind, port = kind, free_port()
        self.outs = [out_dir / f"{kind}-rank{r}.json" for r in range(2)]
        self.errs = [open(out_dir / f"{kind}-rank{r}.err", "w+") for r in range(2)]
        self.procs = [
            subprocess.Popen(
                [
                    python,
                    "-m",
                    "benches.hook_overhead",
                    "--worker",
                    kind.removesuffix("@base"),
                    str(r),
                    str(port),
                    str(self.outs[r]),
                    str(calls),
                    endpoint,
                ],
                cwd=root,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.errs[r],
                text=True,
            )
            for r in range(2)
        ]
        self._expect("ready")

    def _expect(self, word: str) -> None:
        for r, p in enumerate(self.procs):
            line = p.stdout.readline().strip()
            while line and line != word:  # stray prints (DeepSpeed's banners) go past
                line = p.stdout.readline().strip()
            if line != word:
                self.errs[r].seek(0)
                raise RuntimeError(f"{self.kind} rank {r} died:\n{self.errs[r].read()[-3000:]}")

    def send(self, line: str) -> None:
        for p in self.procs:
            p.stdin.write(line + "\n")
            p.stdin.flush()

    def round(self, i: int) -> None:
        self.send(f"round {i}")
        self._expect("done")

    def finish(self, timeout: float = 300) -> list[dict]:
        self.send("end")
        for p in self.procs:
            p.stdin.close()
            p.wait(timeout)
        return [json.loads(o.read_text()) for o in self.outs]

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _background(rank: int, records: int, out: str) -> None:
    """Off-thread cost per record: drain (timings -> rows, bandwidth, summary) and
    encode (rows -> TableBatch envelopes), timed on the calling thread here."""
    import torch
    import torch.distributed as dist

    from collector.rank import comm, recorder, session
    from collector.rank.client import Client, ClientConfig
    from collector.rank.records import RecordBuffer
    from collector.testing.ports import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    recorder.DRAIN_INTERVAL_S = 3600.0  # keep the drain thread out of the way: we drain by hand
    comm.configure({"enabled": True})
    buf = RecordBuffer(max_rows=records + 1)
    session._session = type("BenchSession", (), {"buffer": buf, "client_config": ClientConfig(), "client": None})()
    client = Client(ClientConfig(endpoint="127.0.0.1:1"), "bench.1.x", buf)
    client.run_id, client.rank = "bench", 0
    t = torch.ones(4)
    for _ in range(10):  # warm up: the first encode imports what pyarrow needs lazily (~0.5 s once)
        comm.all_reduce(t)
    comm.flush()
    client._encode(buf.take())
    comm.reset_summary()
    for _ in range(records):
        comm.all_reduce(t)
    t0 = time.perf_counter_ns()
    drained = comm.flush()
    t1 = time.perf_counter_ns()
    envs = client._encode(buf.take())
    t2 = time.perf_counter_ns()
    session._session = None
    wire = sum(e.ByteSize() for e in envs)
    Path(out, "background.json").write_text(
        json.dumps(
            {
                "records": drained,
                "drain_us": (t1 - t0) / 1e3 / drained,
                "encode_us": (t2 - t1) / 1e3 / drained,
                "wire_bytes": wire / drained,
                "envelopes": len(envs),
            }
        )
    )
    dist.destroy_process_group()


def _spread(a: list, b: list) -> str:
    return _spread_fmt(a, b, 1)


def _spread_fmt(a: list, b: list, digits: int) -> str:
    """median [IQR] of b - a, pairwise."""
    d = [y - x for x, y in zip(a, b)]
    return f"{statistics.median(d):+.{digits}f} [{_pct(d, 0.25):+.{digits}f}, {_pct(d, 0.75):+.{digits}f}]"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--worker"]:
        kind, rank, port, out, calls, endpoint = (
            argv[1],
            int(argv[2]),
            int(argv[3]),
            Path(argv[4]),
            int(argv[5]),
            argv[6],
        )
        if kind == "deepspeed":
            _deepspeed(rank, port, out, calls)
        else:
            _ours(kind, rank, port, out, calls, endpoint)
        return 0
    p = argparse.ArgumentParser(prog="python -m benches.hook_overhead", description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=300, help="calls per block (per variant and round)")
    p.add_argument("--rounds", type=int, default=24, help="interleaved rounds")
    p.add_argument("--background-records", type=int, default=100_000, help="records for the off-thread cost")
    p.add_argument("--no-deepspeed", action="store_true", help="skip the DeepSpeed pair")
    p.add_argument(
        "--base",
        metavar="COMMIT",
        help="also run rankscope's pairs on this commit's collector package, in the same rounds (before/after)",
    )
    p.add_argument("--out", default=str(HERE / "RESULTS-hook.md"))
    args = p.parse_args(argv)

    import torch.multiprocessing as mp

    from benches import _deepspeed_venv
    from benches._common import baseline_tree
    from collector.data import catalog
    from collector.server.service import create_server

    ds_python = None if args.no_deepspeed else str(_deepspeed_venv.ensure())
    load = [os.getloadavg()]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = tmp / "data"
        server, port, state = create_server("127.0.0.1:0", data)
        server.start()
        pairs = []
        base_root = None
        if args.base:
            base_root = baseline_tree(ROOT, args.base, tmp / "base")
            # this file's worker code drives the base tree's collector package
            (base_root / "benches" / "hook_overhead.py").write_text(Path(__file__).read_text())
        try:
            endpoint = f"127.0.0.1:{port}"
            for kind in ("logger", "deferred", "attached"):
                pairs.append(_Pair(kind, sys.executable, env, tmp, args.calls, endpoint))
                if base_root is not None:
                    base_env = dict(env, PYTHONPATH=str(base_root))
                    pairs.append(_Pair(f"{kind}@base", sys.executable, base_env, tmp, args.calls, endpoint, base_root))
            if ds_python:
                pairs.append(_Pair("deepspeed", ds_python, _deepspeed_venv.env(), tmp, args.calls, "-"))
            for i in range(args.rounds):
                for pair in pairs if i % 2 == 0 else pairs[::-1]:
                    pair.round(i)
                if i == args.rounds // 2:
                    load.append(os.getloadavg())
            res = {pair.kind: pair.finish() for pair in pairs}
        finally:
            for pair in pairs:
                pair.kill()
            server.stop(grace=2).wait()
            state.close()
        con = catalog.connect(data)
        stored = con.execute("SELECT count(*) FROM comm").fetchone()[0]
        con.close()
        mp.spawn(_background, args=(args.background_records, str(tmp)), nprocs=1)
        bg = json.loads((tmp / "background.json").read_text())
    load.append(os.getloadavg())
    elapsed = time.monotonic() - t_start

    cmd = ("python -m benches.hook_overhead " + " ".join(argv)).strip()
    fmt_load = " -> ".join(f"{one_minute:.1f}" for one_minute, *_ in load)
    lines = [
        "# Hook overhead vs DeepSpeed's comms logger",
        "",
        f"- command: `{cmd}` ({elapsed:.0f} s, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC)",
        f"- machine: {platform.machine()} {os.cpu_count()}-core CPU VM shared with ~8 other jobs; 1-minute load "
        f"average {fmt_load} (start -> middle -> end); Python {platform.python_version()}",
        f"- rankscope code: {code_version(ROOT)}",
        f"- 2 gloo ranks on CPU, 4-element float32 all_reduce; {args.rounds} rounds x {args.calls} calls per "
        "variant, the process pairs and the variants inside each pair interleaved (order rotated every round)",
    ]
    if "deepspeed" in res:
        v = res["deepspeed"][0]["versions"]
        lines.append(
            f"- DeepSpeed {v['deepspeed']} with torch {v['torch']} in .bench-venv-ds (DS_ACCELERATOR=cpu); "
            f"rankscope with the torch in .venv"
        )
    lines += [
        "",
        "## End to end: median wall time per call (us)",
        "",
        "added = difference of the two medians; per-round = median [IQR] over rounds of (median of the round's "
        "block - median of the baseline block in the same round). Baseline: raw torch for rankscope, "
        "deepspeed.comm with the logger off for DeepSpeed (its wrapper without logging).",
        "",
        "| pair | rank | raw torch | baseline | instrumented | added (medians) | added per round, median [IQR] | "
        "added, first / last round | baseline p90 | instrumented p90 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    pairs_def = {
        "logger": ("raw", "logger"),
        "deferred": ("raw", "deferred"),
        "attached": ("raw", "attached"),
        "deepspeed": ("ds logger off", "ds logger on"),
    }
    labels = {
        "logger": "rankscope comms logger (record only)",
        "deferred": "rankscope comms logger, drain between blocks",
        "attached": "rankscope hook.attach (shipped to collector)",
        "deepspeed": "DeepSpeed comms_logger (off -> on)",
    }

    def label(kind: str) -> str:
        plain = kind.removesuffix("@base")
        return labels[plain] + (f", base {args.base}" if kind != plain else "")

    added = {}
    for kind, per_rank in res.items():
        base, inst = pairs_def[kind.removesuffix("@base")]
        for r, x in enumerate(per_rank):
            m, p90, pr = x["median_us"], x["p90_us"], x["per_round_us"]
            added.setdefault(kind, []).append(m[inst] - m[base])
            lines.append(
                f"| {label(kind)} | {r} | {m['raw']:.1f} | {m[base]:.1f} | {m[inst]:.1f} | "
                f"{m[inst] - m[base]:+.1f} | {_spread(pr[base], pr[inst])} | {pr[inst][0] - pr[base][0]:+.1f} / "
                f"{pr[inst][-1] - pr[base][-1]:+.1f} | {p90[base]:.1f} | {p90[inst]:.1f} |"
            )
    lines += [
        "",
        "## Isolated: the wrapper around a no-op collective (us per call, median of 1000-call loops)",
        "",
        "| pair | rank | no-op | wrapper | added | before: enter/complete as method calls, added |",
        "|---|---|---:|---:|---:|---:|",
    ]
    iso_added = {}
    for kind, per_rank in res.items():
        for r, x in enumerate(per_rank):
            iso = x["isolated_us"]
            if kind == "deepspeed":
                a = iso["logger on"] - iso["logger off"]
                lines.append(
                    f"| DeepSpeed logger off -> on | {r} | {iso['no-op']:.3f} | off {iso['logger off']:.3f}, "
                    f"on {iso['logger on']:.3f} (first 500 calls {iso['on first 500']:.3f}, calls "
                    f"9,501-10,000 {iso['on last 500']:.3f}) | {a:.3f} | |"
                )
            else:
                a = iso["wrapper"] - iso["no-op"]
                before = iso["method calls"] - iso["no-op"]
                lines.append(
                    f"| {label(kind)} | {r} | {iso['no-op']:.3f} | {iso['wrapper']:.3f} | {a:.3f} | {before:.3f} |"
                )
            iso_added.setdefault(kind, []).append(a)
    if "deepspeed" in res:
        ds_e2e, ds_iso = statistics.mean(added["deepspeed"]), statistics.mean(iso_added["deepspeed"])
        lines += [
            "",
            "## Ratio ours / DeepSpeed's (added cost per call, mean of the two ranks)",
            "",
            "| ours | ours added (us) | DeepSpeed added (us) | ratio end to end | ours isolated (us) | "
            "DeepSpeed isolated (us) | ratio isolated |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for kind in ("logger", "deferred", "attached"):
            e, i = statistics.mean(added[kind]), statistics.mean(iso_added[kind])
            ratio_e = f"{e / ds_e2e:.3f}" if ds_e2e > 0 else "n/a (DeepSpeed added <= 0)"
            lines.append(
                f"| {kind} | {e:+.1f} | {ds_e2e:+.1f} | {ratio_e} | {i:.3f} | {ds_iso:.3f} | {i / ds_iso:.3f} |"
            )
    if args.base:
        lines += [
            "",
            f"## This code vs {args.base}, same run (added us per call, mean of the two ranks)",
            "",
            "Isolated: the wrapper around the no-op, every round's loops; per round = median [IQR] over rounds of "
            f"(this code's added - {args.base}'s added in the same round), each pair's two ranks averaged; best "
            "loops = fastest wrapper loop - fastest no-op loop of the whole run (the least disturbed by the load).",
            "",
            f"| pair | isolated, this code | isolated, {args.base} | difference | per round, median [IQR] | "
            f"best loops, this code / {args.base} | end to end, this code | end to end, {args.base} |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]

        def best(kind: str) -> float:
            return statistics.mean(x["isolated_us"]["best"] for x in res[kind])

        for kind in ("logger", "deferred", "attached"):
            now_rounds, base_rounds = (
                [statistics.mean(v) for v in zip(*(x["isolated_us"]["added per round"] for x in res[k]))]
                for k in (kind, f"{kind}@base")
            )
            i_now, i_base = statistics.mean(iso_added[kind]), statistics.mean(iso_added[f"{kind}@base"])
            lines.append(
                f"| {labels[kind]} | {i_now:.3f} | {i_base:.3f} | {i_now - i_base:+.3f} | "
                f"{_spread_fmt(base_rounds, now_rounds, 3)} | {best(kind):.3f} / {best(f'{kind}@base'):.3f} | "
                f"{statistics.mean(added[kind]):+.1f} | "
                f"{statistics.mean(added[f'{kind}@base']):+.1f} |"
            )
        lines.append("")
        lines.append(
            "Packages timed: "
            + "; ".join(f"{k}: {res[k][0].get('package', '?')}" for k in res if k != "deepspeed")
            + f" (the base tree is {args.base} exported to a temporary directory)."
        )
    lines += [
        "",
        f"Comm rows stored by the collector for the attached pair{'s' if args.base else ''} (warm-up and isolated "
        f"loops included): {stored}. "
        f"Records dropped: "
        + ", ".join(
            f"{k} {x[0].get('dropped', 0)}/{x[1].get('dropped', 0)}" for k, x in res.items() if k != "deepspeed"
        )
        + ".",
        "",
        f"Off the training thread, per record ({bg['records']} all_reduce records, one process): drain "
        f"(timings -> rows, bandwidth, summary) {bg['drain_us']:.2f} us, encode to TableBatch "
        f"{bg['encode_us']:.2f} us, {bg['wire_bytes']:.0f} bytes on the wire ({bg['envelopes']} envelopes).",
        "",
    ]
    text = "\n".join(lines)
    Path(args.out).write_text(text + NOTES)
    print(text)
    return 0


NOTES = """
## Reading

- The isolated rows are the cost the instrumentation adds to the training thread, free of gloo's
  jitter: rankscope's wrapper is two `perf_counter_ns` reads, a cached group lookup, the op's record
  (one list of 14 slots named by `recorder.SLOT_*`: group, seq, size, entry time, step, ...) put in a
  dict before the call as the in-flight mark and, after it, taken out and appended to a deque (the
  rows, bandwidth and summary are computed by a background thread, costed above per record).
  "before" is the same work done through two recorder method calls (`REC.enter` /
  `REC.complete`), as the wrapper did until they were inlined into it. With `--base`, the base
  pairs time that commit's wrapper: against 4dbd3f1, whose record was a class with 14 named
  `__slots__` (the bare class called, a store per field), the list's best loops were 0.05-0.09 us
  faster in two runs, so the record stayed a list with one set of slot names (issue 30).
  DeepSpeed's `timed_op` binds the call's signature (`inspect.Signature.bind_partial`), computes
  the message size and bandwidth, starts/stops a named timer and appends to its dict on the calling
  thread, and calls `get_accelerator().synchronize()` after every op (a no-op on the CPU
  accelerator; on GPU it is a device-wide sync, which this CPU run cannot show).
- DeepSpeed's timer is read with `elapsed(reset=False)`, which sums every interval recorded under
  that log name so far (plus `inspect.signature` twice in `get_msg_size_from_args`), so its per-call
  cost grows with the number of calls already logged: compare its first / last round and the
  isolated first / last 500 calls.
- "deferred" holds rankscope's background drain off during the timed blocks: if its added cost
  is as large as "logger"'s, the end-to-end difference is not the drain thread competing for the
  GIL and cores.
- End-to-end medians include gloo's own latency and everything else competing for the 2 shared
  cores: the background drain/client threads, in the attached pair the collector (decode, Parquet,
  fsync) in this process, and the other jobs on the VM. A difference smaller than the per-round IQR
  is noise.
"""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
