"""The profiled module tree: what one module (and its subtree) cost, the data the
profiler fills in and the report renders."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class BackwardCall:
    """One forward call's backward: from its first autograd node starting to its last one finishing."""

    begin_ns: int | None = None
    end_ns: int | None = None


@dataclass(eq=False)
class ModuleProfile:
    """What one module (and its subtree) cost during the profiled forward calls."""

    name: str  # dotted path from the root, '' for the root
    module_type: str
    depth: int
    parent: str  # the parent's dotted path; '' for depth-1 modules and for the root itself
    own_params: int = 0  # elements of the parameters this module holds directly (each tensor counted once)
    own_flops: int = 0  # operators run directly in this module's forward, not in a child's
    own_macs: int = 0
    calls: int = 0
    fwd_ns: int = 0  # summed over calls
    children: list[ModuleProfile] = field(default_factory=list)
    backward_calls: list[BackwardCall] = field(default_factory=list)

    @property
    def params(self) -> int:
        return self.own_params + sum(c.params for c in self.children)

    @property
    def flops(self) -> int:
        return self.own_flops + sum(c.flops for c in self.children)

    @property
    def macs(self) -> int:
        return self.own_macs + sum(c.macs for c in self.children)

    @property
    def bwd_ns(self) -> int | None:
        """Summed backward latency; None when no backward went through this module."""
        spans = [
            (c.end_ns if c.end_ns is not None else c.begin_ns) - c.begin_ns
            for c in self.backward_calls
            if c.begin_ns is not None
        ]
        return sum(spans) if spans else None

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()
