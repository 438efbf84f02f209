"""The engine's collectives: ``collector.rank.comm`` (instrumented torch.distributed
with DeepSpeed's comms-logger behaviour), re-exported so engine code reads
``from trainer import comm; comm.all_reduce(...)``."""
from collector.rank.comm import *  # noqa: F401,F403
from collector.rank.comm import __all__  # noqa: F401
