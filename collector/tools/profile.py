"""``rankscope profile RUN --ranks 3,517 --steps 3`` and ``rankscope stacks RUN --ranks 3``: ask ranks
of a live run for evidence, through the collector they stream to (its ``Command`` RPC, with the
collector's token), then wait for their answers in the data dir and show them.

profile: each rank runs torch.profiler over its next ``--steps`` steps (Python stacks included) and
uploads the trace; with two ranks (or ``--reference R``) the diff of the first against the reference
is printed, and ``--out DIR`` writes each trace as Perfetto-openable JSON (``rank<R>.json``) and the
ranks side by side in one (``merged.json``). stacks: each rank's Python stacks (the innermost frame of
each thread) as the ``stacks`` table holds them.

Exit code: 0 every asked rank answered (or ``--wait 0``), 1 a rank refused, failed, was not
reachable or did not answer within ``--wait`` seconds, 2 bad arguments or the collector refused.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import grpc

from collector.data import catalog, queries, security, trace_diff
from collector.data.queries.runs import AmbiguousRun
from collector.server.commands import new_request_id
from proto import pb, pb_grpc

FINAL = ("captured", "refused", "failed")
RPC_TIMEOUT_S = 30.0


def parse_ranks(text: str) -> list[int]:
    """'3,517' / '0-3,8' -> ranks; ValueError naming the bad part."""
    ranks: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            ranks.extend(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise ValueError(f"--ranks: {part!r} is not a rank or a range like 0-3") from None
    return ranks


def _resolve(data_dir, run: str) -> str:
    """A run name to its id where the data dir is readable here; otherwise ``run`` as given."""
    try:
        cat = queries.Catalog(data_dir)
    except queries.DataDirError:
        return run
    try:
        return queries.resolve_run(cat.con, run)
    except AmbiguousRun:
        raise
    except queries.UnknownRun:
        return run
    finally:
        cat.close()


def _answers(data_dir, run_id: str, request_id: str, kind: str):
    try:
        cat = queries.Catalog(data_dir)
    except queries.DataDirError:
        return None, None
    try:
        rows = trace_diff.captures(cat, run_id)
        rows = rows[rows.request_id == request_id]
        stacks = None
        if kind == "stacks":
            stacks = cat.df(
                "select rank, thread_name, is_main, innermost from stacks where run_id = ? and reason = ? "
                "order by rank, is_main desc",
                [run_id, _reason(kind, request_id)],
            )
        return rows, stacks
    except Exception as exc:  # a table written while we read: the next poll reads it again
        if catalog.stopped_by_signal(exc):  # ... but Ctrl-C that landed in the query stops the wait
            raise KeyboardInterrupt from None
        return None, None
    finally:
        cat.close()


def _reason(kind: str, request_id: str) -> str:
    return f"asked by rankscope {kind} ({request_id})"


def main(args: argparse.Namespace, kind: str) -> int:
    try:
        ranks = parse_ranks(args.ranks)
        token = security.resolve_token(args.token)
        channel = security.open_channel(args.endpoint, tls_ca=security.resolve_tls_ca(args.tls_ca))
    except (ValueError, security.SecurityConfigError) as exc:
        print(f"rankscope {kind}: {exc}", file=sys.stderr)
        return 2
    try:
        run_id = _resolve(args.data_dir, args.run)
    except AmbiguousRun as exc:
        print(f"rankscope {kind}: {exc}", file=sys.stderr)
        return 2
    request_id = new_request_id(kind)
    reference = getattr(args, "reference", None)
    if reference is not None and reference not in ranks:
        ranks.append(reference)
    request = pb.RankRequest(
        kind=kind,
        id=request_id,
        steps=getattr(args, "steps", 0),
        with_stack=True,
        record_shapes=getattr(args, "record_shapes", False),
        reason=_reason(kind, request_id),
        role="suspect" if reference is not None else "asked",
    )
    try:
        with channel:
            reply = pb_grpc.CollectorStub(channel).Command(
                pb.CommandRequest(
                    run_id=run_id, ranks=ranks, request=request, references=[reference] if reference is not None else []
                ),
                metadata=security.auth_metadata(token),
                timeout=RPC_TIMEOUT_S,
            )
    except grpc.RpcError as exc:
        print(f"rankscope {kind}: the collector at {args.endpoint} refused: {exc.code().name}: {exc.details()}")
        return 2
    print(f"request {reply.request_id}: sent to rank(s) {', '.join(map(str, reply.sent)) or 'none'}")
    for line in reply.refused:
        print(f"  not sent: {line}")
    if not reply.sent or args.wait <= 0:
        return 1 if reply.refused else 0
    return _wait_and_show(args, kind, run_id, reply)


def _wait_and_show(args, kind: str, run_id: str, reply) -> int:
    deadline = time.monotonic() + args.wait
    rows, stacks = None, None
    while time.monotonic() < deadline:
        rows, stacks = _answers(args.data_dir, run_id, reply.request_id, kind)
        if rows is not None and _done(rows, stacks, reply.sent, kind):
            break
        time.sleep(0.5)
    bad = bool(reply.refused)
    for rank in reply.sent:
        mine = rows[rows["rank"] == rank] if rows is not None else None
        final = mine[mine.status.isin(FINAL)] if mine is not None else None
        if kind == "stacks" and stacks is not None and (stacks["rank"] == rank).any():
            for s in stacks[stacks["rank"] == rank].itertuples():
                print(f"  rank {rank} {s.thread_name}{' (main)' if s.is_main else ''}: {s.innermost}")
        elif final is not None and len(final):
            row = final.iloc[0]
            where = f" -> {row.path} ({row.bytes} bytes, steps {row.step}-{row.last_step})" if row.path else ""
            print(f"  rank {rank}: {row.status}{': ' + row.detail if row.detail else ''}{where}")
            bad |= row.status != "captured"
        else:
            print(f"  rank {rank}: no answer within {args.wait:g} s")
            bad = True
    if kind == "profile" and rows is not None:
        _show_profile(args, rows)
    return 1 if bad else 0


def _done(rows, stacks, sent, kind: str) -> bool:
    if kind == "stacks":
        return stacks is not None and set(sent) <= set(stacks["rank"])
    return set(sent) <= set(rows[rows.status.isin(FINAL)]["rank"])


def _show_profile(args, rows) -> None:
    captured = rows[rows.status == "captured"].sort_values("rank")
    for e in trace_diff.evidence(args.data_dir, captured):
        print(e.get("headline") or e.get("error"))
        for line in e.get("lines", [])[:12]:
            print(
                f"  {line['family']:8} {line['delta_ms']:+9.2f} ms/step  {line['name']}"
                f"  ({line['suspect_ms']:.2f} vs {line['reference_ms']:.2f})"
            )
    if args.out and len(captured):
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        traces = []
        for row in captured.itertuples():
            trace = trace_diff.load(Path(args.data_dir) / row.path)
            (out / f"rank{row.rank}.json").write_text(json.dumps(trace))
            traces.append((int(row.rank), row.role, trace))
        (out / "merged.json").write_text(json.dumps(trace_diff.merged(traces)))
        print(f"traces written to {out}/ (rank<R>.json, merged.json: open in https://ui.perfetto.dev)")
