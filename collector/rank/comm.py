"""The instrumented torch.distributed surface in one namespace, as ``deepspeed.comm``
offers it: every collective and p2p op (collector.rank.ops, recorded), the
pass-throughs scripts need next to them, the comms-logger controls
(collector.rank.recorder) and DeepSpeed's summary table (collector.rank.summary).
``trainer.comm`` re-exports it for the engine.
"""

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from collector.data.bandwidth import convert_size
from collector.rank.ops import *  # noqa: F403  (every op in INSTRUMENTED_OPS)
from collector.rank.ops import batch_isend_irecv, destroy_process_group, init_process_group
from collector.rank.recorder import (
    INSTRUMENTED_OPS,
    CommsLoggerConfig,
    configure,
    dropped_records,
    flush,
    forget_groups,
    get_rank,
    get_world_size,
)
from collector.rank.summary import log_summary, reset_summary, trim_mean

# Pass-throughs the engine and scripts need next to the collectives.
ReduceOp = dist.ReduceOp
group = dist.group
P2POp = dist.P2POp
is_available = dist.is_available
is_initialized = c10d.is_initialized
get_backend = c10d.get_backend
new_group = c10d.new_group
get_global_rank = c10d.get_global_rank
get_process_group_ranks = c10d.get_process_group_ranks
all_gather_object = c10d.all_gather_object
gather_object = c10d.gather_object
broadcast_object_list = c10d.broadcast_object_list
monitored_barrier = c10d.monitored_barrier

__all__ = [
    *INSTRUMENTED_OPS,
    "batch_isend_irecv",
    "ReduceOp",
    "group",
    "P2POp",
    "is_available",
    "is_initialized",
    "get_backend",
    "new_group",
    "get_global_rank",
    "get_process_group_ranks",
    "all_gather_object",
    "gather_object",
    "broadcast_object_list",
    "monitored_barrier",
    "get_rank",
    "get_world_size",
    "init_process_group",
    "destroy_process_group",
    "CommsLoggerConfig",
    "INSTRUMENTED_OPS",
    "configure",
    "flush",
    "forget_groups",
    "dropped_records",
    "log_summary",
    "reset_summary",
    "convert_size",
    "trim_mean",
]
