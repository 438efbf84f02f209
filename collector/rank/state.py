"""The one piece of rank-side state every producer reads: the current training step.

Kept apart so that the hot path (collector.rank.ops via the recorder) and the
session, the engine and the hook share it without importing each other. Records
that do not carry a step of their own are stamped with ``step``.
"""

step = 0


def set_step(value: int) -> None:
    global step
    step = int(value)


def get_step() -> int:
    return step
