"""The engine's collectives: ``collector.comm`` (instrumented torch.distributed
with DeepSpeed's comms-logger behaviour), re-exported so engine code reads
``from trainer import comm; comm.all_reduce(...)``."""
from collector.comm import *  # noqa: F401,F403
from collector.comm import (  # noqa: F401  names `import *` skips or the engine uses by name
    CommsLoggerConfig, INSTRUMENTED_OPS, configure, flush, log_summary, reset_summary, dropped_records,
    ReduceOp, group, P2POp, is_available, is_initialized, get_backend, new_group, get_global_rank,
    get_process_group_ranks, all_gather_object, broadcast_object_list, monitored_barrier, get_rank,
    get_world_size, init_process_group, destroy_process_group, batch_isend_irecv,
)
