"""ZeRO-3 parameter life cycle in one process (the world-of-one path is the distributed path):
parameters are empty outside their module's forward/backward, prefetching changes neither the
gathers issued nor the numbers, and tied weights stay resident.

Split by tier: what needs processes, sockets or seconds is in tests/integration/trainer/test_engine_stage3.py."""

from __future__ import annotations

from torch import nn

from trainer.zero.leaf import mark_by_granularity


def test_granularity_rule_marks_the_first_fine_grained_module_from_the_root():
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(10, 10), nn.Linear(10, 10)  # 110 params each

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.small = Pair()  # 220 // 3 = 73
            self.big = nn.ModuleList([nn.Linear(100, 100)])  # a container: never a leaf
            self.head = nn.Linear(100, 1)  # a torch leaf: never marked

    net = Net()
    assert mark_by_granularity(net, 73) == [net.small]  # Net: 10421 // 6 = 1736 > 73
    assert [type(m) for m in mark_by_granularity(Net(), 1736)] == [Net]
    assert mark_by_granularity(Net(), 72) == []
