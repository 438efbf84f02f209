"""The one piece of rank-side state every producer reads: the current training step.

Kept apart so that the hot path (collector.rank.ops via the recorder) and the
session, the engine and the hook share it without importing each other. Records
that do not carry a step of their own are stamped with ``step``.

``on_step``: one callable told each change of the step (on the training thread: a step boundary;
the hook sets the ended step and then the next one, of which only the second is a change), set
only while a capture waits for or runs across step boundaries (collector.rank.capture); None
otherwise, so a step costs one more global read.
"""

step = 0
on_step = None


def set_step(value: int) -> None:
    global step
    changed = value != step
    step = int(value)
    if changed and on_step is not None:
        on_step(step)


def get_step() -> int:
    return step
