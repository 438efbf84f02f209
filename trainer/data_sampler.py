"""The engine's data sampler: torch's DistributedSampler dealing, resumable mid-epoch on any world size.

Indices are dealt round robin, as DistributedSampler deals them: rank r of W
takes ``perm[start + r], perm[start + r + W], ...`` of the epoch's permutation.
With the DataLoader cutting each rank's stream into micro-batches of m, the
first micro-batches of all ranks together are ``perm[start : start + W*m]``, the
next ones the following W*m, and so on: global batch k is the k-th run of
``train_batch_size`` elements of the permutation *whatever W is*. So the position
to resume from is one number, the samples consumed in the epoch, and a run saved
on 2 ranks continues on 4 with exactly the batches it would have seen.

The engine counts consumption (``advance`` at every optimizer step) rather than
the sampler counting what it handed out, because DataLoader workers prefetch
ahead of training. ``set_epoch`` works as DistributedSampler's (a new
permutation per epoch when shuffling).
"""

from __future__ import annotations

import torch
from torch.utils.data import Sampler


class ResumableDistributedSampler(Sampler[int]):
    def __init__(self, dataset, num_replicas: int, rank: int, *, shuffle: bool = True, seed: int = 0) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"ResumableDistributedSampler: rank {rank} is not in [0, {num_replicas})")
        self.dataset_len = len(dataset)
        self.num_replicas, self.rank = num_replicas, rank
        self.shuffle, self.seed = shuffle, seed
        self.epoch = 0
        self._start = 0  # where the current pass over the epoch began
        self._consumed = 0  # global samples trained on since then
        self._resume_at = 0  # where the next pass begins (a loaded checkpoint's position)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def advance(self, samples: int) -> None:
        """``samples`` more samples (all ranks together) were trained on."""
        self._consumed += samples

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "position": self._start + self._consumed,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "dataset_len": self.dataset_len,
        }

    def load_state_dict(self, sd: dict) -> None:
        if sd.get("dataset_len") not in (None, self.dataset_len):
            raise ValueError(
                f"data sampler: the checkpoint's dataset had {sd['dataset_len']} samples, this one has "
                f"{self.dataset_len}; cannot resume its position"
            )
        self.epoch = int(sd["epoch"])
        self.seed = int(sd.get("seed", self.seed))
        self.shuffle = bool(sd.get("shuffle", self.shuffle))
        self._resume_at = int(sd["position"])

    def _permutation(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.dataset_len))
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.dataset_len, generator=g).tolist()

    def __iter__(self):
        start = min(self._resume_at, self.dataset_len)
        self._start, self._consumed, self._resume_at = start, 0, 0
        perm = self._permutation()
        per_rank = (self.dataset_len - start) // self.num_replicas
        first = start + self.rank
        return iter(perm[first : first + per_rank * self.num_replicas : self.num_replicas])

    def __len__(self) -> int:
        return (self.dataset_len - min(self._resume_at, self.dataset_len)) // self.num_replicas
