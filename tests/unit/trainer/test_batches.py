"""trainer.batches: samples and tokens per step from the forward inputs' shapes, checked against
the batches the test builds (token ids count tokens, padding included; float inputs only samples)."""

from __future__ import annotations

import torch

from trainer.batches import BatchCounter


def test_token_ids_count_samples_and_tokens_summed_over_micro_batches():
    counter = BatchCounter()
    counter.count((torch.zeros(4, 128, dtype=torch.long), torch.zeros(4, 128, dtype=torch.long)), {})
    counter.count((), {"input_ids": torch.zeros(4, 300, dtype=torch.int32)})  # a longer micro-batch
    assert counter.records(7) == [{"step": 7, "samples": 8, "tokens": 4 * 128 + 4 * 300}]
    assert counter.records(8) == []  # reset: no forward since


def test_float_inputs_count_samples_only_and_no_tensor_counts_nothing():
    counter = BatchCounter()
    counter.count((torch.randn(16, 32),), {})
    counter.count(("not a tensor",), {"flag": True})
    assert counter.records(0) == [{"step": 0, "samples": 16}]  # tokens left out: stored as NULL
    counter.count((torch.tensor(3.0),), {})  # a scalar is no batch
    assert counter.records(1) == []
