"""What each rank trained on in a step: samples and tokens, the ``batches`` records.

Ranks of one data-parallel job get different batches; with variable-length sequences (dynamic
padding, packing) one rank can get far more tokens in a step than the others and arrive late at
every collective after it. That is *input imbalance*, and the health summary names it as the
cause of a straggler when this rank's tokens stand out on its late steps.

Counted from the forward's inputs, host metadata only (shapes and dtypes, never values, so no
device sync): the first tensor argument is the batch; its first dimension counts samples, and
when it holds integers (token ids) its element count counts tokens, padding included. Float
inputs (features, images) have samples and no tokens.
"""

from __future__ import annotations

import torch


def first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None


class BatchCounter:
    """Samples and tokens of the forwards of one optimizer step (its micro-batches summed)."""

    def __init__(self) -> None:
        self.samples = 0
        self.tokens: int | None = None
        self.seen = False

    def count(self, args: tuple, kwargs: dict) -> None:
        batch = first_tensor(args, kwargs)
        if batch is None or batch.dim() == 0:
            return
        self.seen = True
        self.samples += int(batch.shape[0])
        if not batch.is_floating_point() and not batch.is_complex() and batch.dtype != torch.bool:
            self.tokens = (self.tokens or 0) + batch.numel()

    def records(self, step: int) -> list[dict]:
        """This step's ``batches`` row (none if no forward had a tensor input; no ``tokens`` key where it
        saw no token ids: a column left out is stored as NULL); resets for the next step."""
        row = {"step": step, "samples": self.samples} | ({"tokens": self.tokens} if self.tokens is not None else {})
        rows = [row] if self.seen else []
        self.samples, self.tokens, self.seen = 0, None, False
        return rows
