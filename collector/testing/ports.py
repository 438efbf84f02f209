"""Free loopback ports. The one definition lives with the process launchers in
``collector.tools.launch`` (the demo needs it too); tests and benchmarks take it
from here with the rest of their plumbing."""

from collector.tools.launch import free_port

__all__ = ["free_port"]
