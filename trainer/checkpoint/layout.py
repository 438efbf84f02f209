"""Where a checkpoint's files go, and reading or writing them safely.

    save_dir/
      latest                        the newest tag (DeepSpeed's file), replaced once that tag is complete
      <tag>/                        one folder per save: global_step<N> unless a tag is given
        checkpoint.json             the index (below), written after every other file of the tag
        engine_states.pt            param-group options, lr scheduler, loss scaler, data sampler
        client_state.pt             the client_state dict given to save_checkpoint, as given
        shards/rank_<R>.pt          what rank R wrote: fragments of parameters (fp32 master values
                                    and optimizer moments, by parameter name), buffers, its RNG

A tag folder without ``checkpoint.json`` is a save that did not finish (or
not a rankscope checkpoint); loading it says so instead of reading half a
model. Every file is written to a temporary name and renamed into place.

The index (``checkpoint.json``, JSON so people and scripts can read it)::

    {"format": "rankscope-universal-checkpoint", "version": 1, "tag": "global_step10",
     "written_by": {"world_size": 2, "dp_world_size": 2, "tp_size": 1, "zero_stage": 2, ...},
     "engine": {"global_steps": 10, "global_samples": 160, "skipped_steps": 0},
     "optimizer": {"type": "AdamW", "state": ["exp_avg", "exp_avg_sq"], "param_groups": 1},
     "mp_ranks": [                  one entry per tensor-parallel rank (one without tensor parallelism)
       {"parameters": {"wte.weight": {"shape": [128, 64], "dtype": "float32", "group": 0,
                                      "fragments": [["shards/rank_00000.pt", 0, 4096],
                                                    ["shards/rank_00001.pt", 4096, 4096]]}, ...},
        "aliases": {"lm_head.weight": "wte.weight"},      tied parameters, by the name they are kept under
        "buffers": {"blocks.0.mask": "shards/rank_00000.pt"},
        "frozen": {},                                     parameters with requires_grad=False
        "order": ["wte.weight", ...]}]}                   the module's state_dict keys, in its order

A fragment ``[file, offset, numel]`` is elements ``[offset, offset + numel)`` of
the flattened parameter; the fragments of a parameter cover it exactly once.
Names are the module's own ``named_parameters`` names, except MoE experts,
which are named by global expert id (trainer.checkpoint.names).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import torch

FORMAT = "rankscope-universal-checkpoint"
VERSION = 1
INDEX = "checkpoint.json"
LATEST = "latest"
ENGINE_STATES = "engine_states.pt"
CLIENT_STATE = "client_state.pt"
SHARDS = "shards"


class CheckpointError(ValueError):
    """A checkpoint that cannot be written, read or resumed here; the message names the file,
    parameter or setting at fault."""


def shard_file(rank: int) -> str:
    """Rank ``rank``'s shard file, relative to the tag folder (as the index names it)."""
    return f"{SHARDS}/rank_{rank:05d}.pt"


def default_tag(global_steps: int) -> str:
    return f"global_step{global_steps}"


def resolve_tag_dir(path, tag=None) -> str | None:
    """The tag folder to load: ``path/tag`` when a tag is given; ``path`` itself when it is a tag
    folder (holds checkpoint.json); else ``path/<the tag in path/latest>``. None when ``path`` has
    no ``latest`` file and no tag was given (DeepSpeed returns ``(None, None)`` then)."""
    path = os.fspath(path)
    if tag is not None:
        return os.path.join(path, str(tag))
    if os.path.isfile(os.path.join(path, INDEX)):
        return path
    latest = os.path.join(path, LATEST)
    if not os.path.isfile(latest):
        return None
    with open(latest) as f:
        name = f.read().strip()
    if not name:
        raise CheckpointError(f"{latest} is empty: it should name the newest tag folder")
    return os.path.join(path, name)


def read_index(tag_dir: str) -> dict:
    """The parsed checkpoint.json of ``tag_dir``, checked for format and version."""
    path = os.path.join(tag_dir, INDEX)
    if not os.path.isdir(tag_dir):
        raise CheckpointError(f"checkpoint folder {tag_dir} does not exist")
    if not os.path.isfile(path):
        raise CheckpointError(
            f"{tag_dir} has no {INDEX}: the save did not finish, or this is not a rankscope checkpoint"
        )
    try:
        with open(path) as f:
            index = json.load(f)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror or e}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise CheckpointError(
            f"{path}: not a rankscope checkpoint index (format {index.get('format')!r})"
            if isinstance(index, dict)
            else f"{path}: not a rankscope checkpoint index"
        )
    if not isinstance(index.get("version"), int) or index["version"] > VERSION:
        raise CheckpointError(
            f"{path}: format version {index.get('version')!r} is newer than this rankscope "
            f"reads (version {VERSION}); upgrade rankscope to load it"
        )
    return index


def write_atomic(path: str, write: Callable[[str], None]) -> None:
    """``write(tmp)`` then rename onto ``path``, so a reader never sees a half-written file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_torch(obj: Any, path: str) -> None:
    write_atomic(path, lambda tmp: torch.save(obj, tmp))


def save_json(obj: Any, path: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")

    write_atomic(path, write)


def write_latest(save_dir: str, tag: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(tag)

    write_atomic(os.path.join(save_dir, LATEST), write)


def load_torch(path: str, *, mmap: bool = False, trusted: bool = False) -> Any:
    """torch.load with errors naming the file. Checkpoint files hold tensors and plain containers
    only (``weights_only``); ``trusted`` unpickles anything, for client_state, which is the
    user's own objects as DeepSpeed keeps them."""
    try:
        return torch.load(path, map_location="cpu", mmap=mmap, weights_only=not trusted)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file {path} is missing") from None
    except Exception as e:  # truncated or corrupt zip, unpickling refused, ...
        raise CheckpointError(
            f"cannot read checkpoint file {path}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from None
