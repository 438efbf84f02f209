"""Bandwidth of one collective, as nccl-tests defines it (doc/PERFORMANCE.md).

    algbw = S / t                      S = the op's data size in bytes (below)
    busbw = algbw * factor(op, n)      n = the size of the group the op ran on

S per op: all_reduce / broadcast / reduce / send / recv: the tensor;
all_gather: the gathered output (n x the input); reduce_scatter: the full input
(n x the output); all_to_all: the input; gather / scatter: the gathered /
scattered whole (n x one rank's chunk); barrier: 0.

busbw factors (the fraction of S each rank's busiest link carries, so busbw is
comparable to the hardware's link speed whatever n is):
  all_reduce                                    2(n-1)/n
  all_gather, reduce_scatter, all_to_all,
  gather, scatter                                (n-1)/n
  broadcast, reduce, send, recv                  1

Where DeepSpeed's ``calc_bw_log`` (deepspeed/utils/comms_logging.py) differs:
* it always uses the *world* size, not the group's, so ops on sub-groups (tensor /
  pipeline / expert parallel) get the wrong factor;
* its message size is the input tensor(s), multiplied by n for all_gather (right:
  that is the gathered output) and for reduce_scatter (wrong: the input already is
  the full S), so reduce_scatter algbw/busbw come out n times too high;
* its all_reduce "tput" is 2 x S / t, where nccl-tests' algbw is S / t;
* it reports Gbps (bits, 1e9); ``gbps(gbs)`` converts ours for the DeepSpeed-style
  summary table, which keeps DeepSpeed's column names.

Pure Python, no torch: the collector, the dashboard and importers share it.
"""

from __future__ import annotations

import math

_ALL_REDUCE = ("all_reduce", "all_reduce_coalesced", "inference_all_reduce")
_GATHER_LIKE = (
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_coalesced",
    "_all_gather_base",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "_reduce_scatter_base",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
)
_ONE = ("broadcast", "reduce", "send", "recv", "isend", "irecv")

# op name (a torch.distributed function name) -> kind used for the factor
OP_KINDS: dict[str, str] = {
    **{op: "all_reduce" for op in _ALL_REDUCE},
    **{op: "gather_like" for op in _GATHER_LIKE},
    **{op: "one" for op in _ONE},
    "barrier": "none",
    "monitored_barrier": "none",
}


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw for ``op`` on a group of ``n`` ranks (0 for barrier and unknown ops)."""
    if n < 1:
        raise ValueError(f"group size must be >= 1, got {n}")
    kind = OP_KINDS.get(op, "none")
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind == "gather_like":
        return (n - 1) / n
    if kind == "one":
        return 1.0
    return 0.0


def bandwidth(op: str, nbytes: int, duration_ns: int, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s); (0, 0) for a zero duration or size."""
    if duration_ns <= 0 or nbytes <= 0:
        return 0.0, 0.0
    algbw = nbytes / duration_ns  # bytes per ns == GB/s
    return algbw, algbw * bus_factor(op, n)


def gbps(gbs: float) -> float:
    """GB/s (bytes) -> Gbps (bits), the unit of DeepSpeed's comms summary."""
    return gbs * 8.0


def convert_size(size_bytes: int) -> str:
    """DeepSpeed's message-size label: binary units, two decimals ('2.0 KB', '678.86 MB')."""
    if size_bytes == 0:
        return "0B"
    names = ("B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB")
    i = math.floor(math.log(size_bytes, 1024))
    return f"{round(size_bytes / math.pow(1024, i), 2)} {names[i]}"
