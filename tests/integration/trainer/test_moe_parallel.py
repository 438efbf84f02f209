"""Expert parallelism on 4 gloo ranks (torch.multiprocessing spawn, CPU).

Every rank routes its own tokens; for ep_size 1, 2 and 4 (top-1 and top-2, and
no-drop mode) each rank's output and every gradient (after
trainer.moe.reduce_gradients, after trainer.moe.broadcast_parameters synced
the replicas) must equal a single-process token-by-token
reference built from the gathered expert weights, within 1e-5. Records go to
a real collector; the test then reads them back with DuckDB: all_to_all on
the expert-parallel groups with their sizes and busbw factors, and per-expert
``moe`` rows whose dropped counts follow the capacity arithmetic exactly."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn

from collector.data import catalog
from collector.testing.gloo import leave_world, run_ranks
from tests._moe_reference import reference_capacity, reference_moe

WORLD, M, E, S = 4, 8, 4, 12  # ranks, hidden, experts, tokens per rank
F32 = 4
# (step, ep_size, k, drop_tokens): the step tags this case's telemetry rows
CASES = [
    (1, 1, 1, True),
    (2, 1, 2, True),
    (3, 2, 1, True),
    (4, 2, 2, True),
    (5, 4, 1, True),
    (6, 4, 2, True),
    (7, 2, 1, False),
]
CAPACITY_FACTOR = 0.75  # low enough that experts overflow


def expert() -> nn.Module:
    return nn.Sequential(nn.Linear(M, 6), nn.GELU(), nn.Linear(6, M))


def tokens_of(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(3, S // 3, M, generator=g)  # [3, 4, M]: S tokens


def check_case(rank: int, step: int, ep: int, k: int, drop: bool, tp: int = 1) -> None:
    """One MoE layer on WORLD ranks; with tp > 1 the ranks of a tensor-parallel group
    (consecutive ranks) see the same tokens and experts span the data-parallel ranks."""
    from collector.rank import session
    from trainer import comm
    from trainer.moe import MoE, broadcast_parameters, reduce_gradients
    from trainer.tensor_parallel import parallel_groups

    dp_group = parallel_groups(tp).dp_group
    DP, dp_rank = WORLD // tp, rank // tp

    session.set_step(step)
    torch.manual_seed(step)  # same on every rank: the gate and the expert seeds agree
    moe = MoE(
        M,
        expert(),
        num_experts=E,
        ep_size=ep,
        k=k,
        capacity_factor=CAPACITY_FACTOR,
        min_capacity=1,
        drop_tokens=drop,
        use_rts=False,
        top2_2nd_expert_sampling=False,
        layer_id=10 + step,
        tp_size=tp,
    )
    with torch.no_grad():  # ranks disagree until broadcast_parameters syncs each parameter over its group
        for p in moe.parameters():
            p.add_(0.01 * dp_rank)
    broadcast_parameters(moe, dp_group)
    x = tokens_of(dp_rank, step).requires_grad_(True)
    out, aux, counts = moe(x)
    (out.square().sum() + aux).backward()
    reduce_gradients(moe, dp_group)

    # the reference holds all E experts: gather every rank's local experts (global order)
    gathered = [None] * WORLD
    comm.all_gather_object(
        gathered, {moe.experts.first_expert + i: e.state_dict() for i, e in enumerate(moe.experts.local_experts)}
    )
    states = {}
    for part in gathered:
        for e, sd in part.items():
            if e in states:  # another expert-parallel (or tensor-parallel) group's copy of the same expert
                assert all(torch.equal(sd[n], states[e][n]) for n in sd)
            states[e] = sd
    assert not torch.equal(states[0]["0.weight"], states[E - 1]["0.weight"]), "experts stay distinct"
    gates = [None] * WORLD
    comm.all_gather_object(gates, moe.gate.weight.detach())
    assert all(torch.equal(g, gates[0]) for g in gates), "dense parameters agree after the broadcast"
    experts = [copy.deepcopy(expert()) for _ in range(E)]
    for e, module in enumerate(experts):
        module.load_state_dict(states[e])
    gate_weight = moe.gate.weight.detach().clone().requires_grad_(True)

    inputs = [tokens_of(q, step).reshape(-1, M).requires_grad_(True) for q in range(DP)]
    if drop:
        capacity = [reference_capacity(S, E, k, CAPACITY_FACTOR, 1)] * DP
    else:  # no-drop: the busiest expert over this rank's expert-parallel group
        loads = [reference_moe(t.detach(), gate_weight.detach(), experts, k=k, capacity=S)[2].max() for t in inputs]
        capacity = [max(int(loads[g - g % ep + j]) for j in range(ep)) for g in range(DP)]
    refs = [reference_moe(t, gate_weight, experts, k=k, capacity=c) for t, c in zip(inputs, capacity)]
    loss = sum(o.square().sum() + a for o, a, _, _ in refs) / DP  # the data-parallel mean
    loss.backward()

    ref_out, _, routed, dropped = refs[dp_rank]
    assert torch.equal(counts, routed)
    if drop:
        assert torch.equal(dropped, (routed - capacity[dp_rank]).clamp_min(0))
    else:
        assert int(dropped.sum()) == 0
    tol = dict(rtol=0, atol=1e-5)
    torch.testing.assert_close(out.reshape(-1, M), ref_out, **tol)
    torch.testing.assert_close(x.grad.reshape(-1, M) / DP, inputs[dp_rank].grad, **tol)
    torch.testing.assert_close(moe.gate.weight.grad, gate_weight.grad, **tol)
    for i, local in enumerate(moe.experts.local_experts):
        for p, ref_p in zip(local.parameters(), experts[moe.experts.first_expert + i].parameters()):
            torch.testing.assert_close(p.grad, ref_p.grad, **tol)


def worker(rank: int, port: int, endpoint: str, out: str) -> None:
    from collector.rank import session
    from trainer import comm
    from trainer.moe import MoE

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    session.start(run="moe-ep", endpoint=endpoint)
    comm.init_process_group("gloo", rank=rank, world_size=WORLD)
    for case in CASES:
        check_case(rank, *case)
    for kwargs, message in (
        (dict(num_experts=6, ep_size=4), "moe.num_experts: must be divisible by moe.ep_size (4) (got 6)"),
        (dict(num_experts=8, ep_size=8), "moe.ep_size: must not exceed the world size 4 (got 8)"),
        (dict(num_experts=6, ep_size=3), "moe.ep_size: must divide the world size 4 (got 3)"),
    ):
        with pytest.raises(ValueError) as e:
            MoE(M, expert(), **kwargs)
        assert str(e.value) == message
    session.stop()
    leave_world()


def test_expert_parallel_matches_reference_and_telemetry_shows_expert_groups(live_collector, tmp_path):
    endpoint, data = live_collector
    run_ranks(worker, WORLD, endpoint, str(tmp_path))

    con = catalog.connect(data)
    q = lambda sql, *p: con.execute(sql, list(p)).fetchall()
    (run_id,) = q("SELECT run_id FROM runs WHERE name = 'moe-ep'")[0]
    cases = {step: (ep, k, drop) for step, ep, k, drop in CASES}

    # all_to_all: two forward, two backward per MoE forward (and the fill counts), only where ep > 1, on the ep group
    a2a = q(
        """SELECT step, rank, group_name, group_size, log_name, bytes, numel, algbw_gbs, busbw_gbs
               FROM comm WHERE run_id = ? AND op = 'all_to_all_single' ORDER BY step, rank, seq""",
        run_id,
    )
    per_step_rank = {}
    for step, rank, group, size, log_name, nbytes, numel, algbw, busbw in a2a:
        ep, k, drop = cases[step]
        assert ep > 1, "ep_size 1 sends nothing"
        first = rank - rank % ep
        # the group's role and ranks as collector.rank.comm labels them; ep_size == world is the world group
        assert group == ("world" if ep == WORLD else f"ep[{first}-{first + ep - 1}]")
        assert size == ep
        per_step_rank.setdefault((step, rank), []).append(log_name)
        if log_name == "moe.fill_counts":  # [E] int64: how many slots of each expert this rank filled
            assert (numel, nbytes) == (E, E * 8)
            continue
        assert nbytes == numel * F32 and numel % (E * M) == 0  # [E, C, M] buffers
        if drop:
            assert numel == E * reference_capacity(S, E, k, CAPACITY_FACTOR, 1) * M
        assert busbw == pytest.approx(algbw * (ep - 1) / ep, rel=1e-9)
    expected_names = ["moe.fill_counts", "moe.dispatch", "moe.combine", "moe.combine.backward", "moe.dispatch.backward"]
    assert per_step_rank == {(s, r): expected_names for s, (ep, _, _) in cases.items() if ep > 1 for r in range(WORLD)}
    # rows of one all_to_all join across exactly the ranks of its group
    assert q(
        """SELECT count(*) FROM (SELECT group_name, seq, count(*) n, any_value(group_size) g FROM comm
                WHERE run_id = ? AND op = 'all_to_all_single' GROUP BY ALL HAVING n <> g)""",
        run_id,
    ) == [(0,)]
    # the no-drop capacity is agreed with a MAX all_reduce on the expert-parallel group
    assert q(
        """SELECT DISTINCT step, group_size FROM comm WHERE run_id = ? AND log_name = 'moe.no_drop_capacity'""", run_id
    ) == [(7, 2)]

    # per-expert telemetry: every rank, case and expert; dropped = max(0, tokens - capacity)
    rows = q("SELECT step, rank, layer, expert, tokens, dropped, capacity, aux_loss FROM moe WHERE run_id = ?", run_id)
    assert len(rows) == len(CASES) * WORLD * E
    for step, _rank, layer, expert_id, tokens, dropped, capacity, aux_loss in rows:
        ep, k, drop = cases[step]
        assert layer == 10 + step and 0 <= expert_id < E and aux_loss > 0
        if drop:
            assert capacity == reference_capacity(S, E, k, CAPACITY_FACTOR, 1)
            assert dropped == max(0, tokens - capacity)
        else:
            assert dropped == 0 and capacity >= tokens
    assert q("SELECT step, rank, sum(tokens) FROM moe WHERE run_id = ? GROUP BY ALL ORDER BY ALL", run_id) == [
        (s, r, k * S) for s, _, k, _ in CASES for r in range(WORLD)
    ]
    assert q("SELECT sum(dropped) FROM moe WHERE run_id = ? AND step IN (1, 3, 5)", run_id)[0][0] > 0
    con.close()
