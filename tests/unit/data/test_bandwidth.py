"""collector.data.bandwidth against nccl-tests' definitions (doc/PERFORMANCE.md and
the *GetBw functions of src/*.cu): busbw = algbw x factor for n = 2, 4, 8."""

from __future__ import annotations

import pytest

from collector.data import bandwidth

# factor busbw/algbw per nccl-tests, written out (not computed) for n = 2, 4, 8
TABLE = {
    "all_reduce": (1.0, 1.5, 1.75),  # 2(n-1)/n
    "all_reduce_coalesced": (1.0, 1.5, 1.75),
    "all_gather": (0.5, 0.75, 0.875),  # (n-1)/n
    "all_gather_into_tensor": (0.5, 0.75, 0.875),
    "all_gather_coalesced": (0.5, 0.75, 0.875),
    "all_gather_single": (0.5, 0.75, 0.875),
    "reduce_scatter": (0.5, 0.75, 0.875),  # (n-1)/n
    "reduce_scatter_tensor": (0.5, 0.75, 0.875),
    "reduce_scatter_single": (0.5, 0.75, 0.875),
    "all_to_all": (0.5, 0.75, 0.875),  # (n-1)/n
    "all_to_all_single": (0.5, 0.75, 0.875),
    "gather": (0.5, 0.75, 0.875),  # (n-1)/n
    "scatter": (0.5, 0.75, 0.875),
    "broadcast": (1.0, 1.0, 1.0),  # 1
    "reduce": (1.0, 1.0, 1.0),
    "send": (1.0, 1.0, 1.0),  # sendrecv: 1
    "recv": (1.0, 1.0, 1.0),
    "isend": (1.0, 1.0, 1.0),
    "irecv": (1.0, 1.0, 1.0),
    "barrier": (0.0, 0.0, 0.0),  # no data
}


@pytest.mark.parametrize("op", sorted(TABLE))
@pytest.mark.parametrize("i,n", [(0, 2), (1, 4), (2, 8)])
def test_bus_factor_matches_nccl_tests(op, i, n):
    assert bandwidth.bus_factor(op, n) == pytest.approx(TABLE[op][i], rel=1e-12)


def test_every_instrumented_op_has_a_factor():
    from collector.rank.comm import INSTRUMENTED_OPS

    assert set(INSTRUMENTED_OPS) <= set(TABLE) and set(INSTRUMENTED_OPS) <= set(bandwidth.OP_KINDS)


def test_algbw_is_bytes_over_time_in_gb_per_s():
    # 1 GiB all_reduce in 10 ms on 8 ranks: algbw 107.37 GB/s, busbw 1.75x
    algbw, busbw = bandwidth.bandwidth("all_reduce", 1 << 30, 10_000_000, 8)
    assert algbw == pytest.approx(107.374182, rel=1e-6)
    assert busbw == pytest.approx(187.904819, rel=1e-6)


def test_a_single_rank_group_has_no_bus_traffic():
    assert bandwidth.bus_factor("all_reduce", 1) == 0.0
    assert bandwidth.bus_factor("all_gather", 1) == 0.0
    assert bandwidth.bandwidth("all_reduce", 4096, 1000, 1) == (pytest.approx(4.096), 0.0)


def test_degenerate_inputs():
    assert bandwidth.bandwidth("all_reduce", 4096, 0, 4) == (0.0, 0.0)
    assert bandwidth.bandwidth("barrier", 0, 5000, 4) == (0.0, 0.0)
    assert bandwidth.bus_factor("no_such_op", 4) == 0.0
    with pytest.raises(ValueError, match="group size must be >= 1"):
        bandwidth.bus_factor("all_reduce", 0)


def test_gbps_is_bits():
    assert bandwidth.gbps(1.5) == 12.0
