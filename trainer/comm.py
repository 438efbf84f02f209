"""The engine's collectives: ``collector.comm`` (instrumented torch.distributed
with DeepSpeed's comms-logger behaviour), re-exported so engine code reads
``from trainer import comm; comm.all_reduce(...)``."""
from collector.comm import *  # noqa: F401,F403
from collector.comm import __all__  # noqa: F401
