"""The engine's collectives: ``collector.rank.comm`` (instrumented torch.distributed
with DeepSpeed's comms-logger behaviour), re-exported so engine code reads
``from trainer import comm; comm.all_reduce(...)``."""

from collector.rank.comm import *  # noqa: F403
from collector.rank.comm import __all__ as _all

# The engine gathers and reduce-scatters flat buffers with torch's current functions where they
# exist (torch 2.13 deprecates the long names); the comm rows carry the long names either way.
try:
    from collector.rank.comm import all_gather_single as gather_flat
    from collector.rank.comm import reduce_scatter_single as scatter_flat
except ImportError:  # an older torch: only the long names
    from collector.rank.comm import all_gather_into_tensor as gather_flat
    from collector.rank.comm import reduce_scatter_tensor as scatter_flat

__all__ = [*_all, "gather_flat", "scatter_flat"]
