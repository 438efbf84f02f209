"""DeepSpeed's ``zero_to_fp32``: one fp32 state dict from a sharded checkpoint, no ranks needed.

    python -m trainer.checkpoint.zero_to_fp32 CHECKPOINT_DIR OUTPUT [-t TAG] [--exclude_frozen_parameters]

CHECKPOINT_DIR is the folder given to ``save_checkpoint`` (its ``latest`` tag is
used unless ``-t TAG`` names another) or a tag folder itself. OUTPUT is a file
when it ends in .pt, .pth or .bin, else a folder that receives
``pytorch_model.bin`` (DeepSpeed's current behaviour). The result loads into the
plain model with ``load_state_dict(strict=True)``: every trainable parameter as
its fp32 master (whatever precision trained), tied weights as one tensor under
both names, buffers and frozen parameters as the model held them, MoE experts
under their global ids (the names of the same model built with ep_size 1).

The same as functions, with DeepSpeed's names::

    get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None, exclude_frozen_parameters=False) -> dict
    convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output, tag=None,
                                               exclude_frozen_parameters=False) -> output file
    load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag=None) -> model

Memory: the consolidated model once, in host memory; shard files are
memory-mapped, so only the pages being copied are resident besides it.
Checkpoints of tensor-parallel runs (tp_size > 1) hold slices of the
tensor-parallel layers, which this does not merge: it says so and stops.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import torch
from torch import nn

from trainer.checkpoint.fragments import FragmentSource
from trainer.checkpoint.layout import CheckpointError, read_index, resolve_tag_dir

OUTPUT_FILE = "pytorch_model.bin"
_FILE_SUFFIXES = (".pt", ".pth", ".bin")


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def get_fp32_state_dict_from_zero_checkpoint(
    checkpoint_dir,
    tag=None,
    exclude_frozen_parameters: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """The consolidated state dict (see the module docstring); ``progress(done, total)`` is
    called as parameters are assembled."""
    tag_dir = resolve_tag_dir(checkpoint_dir, tag)
    if tag_dir is None:
        raise CheckpointError(
            f"{os.fspath(checkpoint_dir)} holds no checkpoint: no 'latest' file and no "
            f"checkpoint.json (give the tag folder, or -t TAG)"
        )
    index = read_index(tag_dir)
    tp = index["written_by"]["tp_size"]
    if tp != 1:
        raise CheckpointError(
            f"checkpoint {tag_dir} was written with tensor_parallel.tp_size {tp}: its parameters are "
            f"tensor-parallel slices, which zero_to_fp32 does not merge"
        )
    entry = index["mp_ranks"][0]
    params = entry["parameters"]
    source = FragmentSource(tag_dir, params)
    out: dict[str, torch.Tensor] = {}
    done = 0
    try:
        for name in entry["order"]:
            if name in entry["aliases"]:
                target = entry["aliases"][name]
                if target in out:
                    out[name] = out[target]
            elif name in params:
                shape = params[name]["shape"]
                flat = torch.empty(_numel(shape), dtype=torch.float32)
                source.copy_into(name, 0, flat.numel(), {"fp32": flat})
                out[name] = flat.view(shape)
                done += 1
                if progress is not None:
                    progress(done, len(params))
            elif name in entry["frozen"] or name in entry["buffers"]:
                if name in entry["frozen"] and exclude_frozen_parameters:
                    continue
                rel = entry["frozen"].get(name) or entry["buffers"][name]
                value = source.shard(rel)["tensors"].get(name)
                if value is None:
                    raise CheckpointError(f"checkpoint {tag_dir}: {name} is missing from {rel}")
                out[name] = value.clone()
            else:
                raise CheckpointError(f"checkpoint {tag_dir}: checkpoint.json lists {name} but holds no data for it")
    finally:
        source.close()
    return out


def _output_file(output) -> str:
    output = os.fspath(output)
    if output.endswith(_FILE_SUFFIXES):
        parent = os.path.dirname(output)
        if parent:
            os.makedirs(parent, exist_ok=True)
        return output
    os.makedirs(output, exist_ok=True)
    return os.path.join(output, OUTPUT_FILE)


def convert_zero_checkpoint_to_fp32_state_dict(
    checkpoint_dir,
    output,
    tag=None,
    exclude_frozen_parameters: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> str:
    """Write the consolidated state dict with torch.save; returns the file written."""
    state_dict = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters, progress)
    path = _output_file(output)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        torch.save(state_dict, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def load_state_dict_from_zero_checkpoint(model: nn.Module, checkpoint_dir, tag=None) -> nn.Module:
    """Load the consolidated fp32 weights into ``model`` (moved to the CPU, as DeepSpeed does);
    every key must match (the first that does not is named)."""
    state_dict = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    result = model.load_state_dict(state_dict, strict=False)
    if result.missing_keys:
        raise CheckpointError(
            f"{os.fspath(checkpoint_dir)}: {result.missing_keys[0]} of the model is not in the "
            f"checkpoint ({len(result.missing_keys)} missing)"
        )
    if result.unexpected_keys:
        raise CheckpointError(
            f"{os.fspath(checkpoint_dir)}: the checkpoint holds {result.unexpected_keys[0]}, which "
            f"the model does not have ({len(result.unexpected_keys)} unexpected)"
        )
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.checkpoint.zero_to_fp32",
        description="Consolidate a sharded rankscope checkpoint into one fp32 state dict.",
    )
    parser.add_argument("checkpoint_dir", help="the folder given to save_checkpoint, or a tag folder in it")
    parser.add_argument("output", help=f"output file (.pt/.pth/.bin) or folder (receives {OUTPUT_FILE})")
    parser.add_argument("-t", "--tag", default=None, help="tag folder to convert (default: the one in 'latest')")
    parser.add_argument("--exclude_frozen_parameters", action="store_true", help="leave out frozen parameters")
    args = parser.parse_args(argv)
    shown = {"decile": -1}

    def progress(done: int, total: int) -> None:  # a line per tenth of the parameters
        decile = done * 10 // total
        if decile != shown["decile"]:
            shown["decile"] = decile
            print(f"assembled {done}/{total} parameters", file=sys.stderr, flush=True)

    try:
        path = convert_zero_checkpoint_to_fp32_state_dict(
            args.checkpoint_dir, args.output, args.tag, args.exclude_frozen_parameters, progress
        )
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: cannot write {e.filename or args.output}: {e.strerror or e}", file=sys.stderr)
        return 2
    sd = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    total = sum(t.numel() for t in {id(t): t for t in sd.values()}.values())
    print(f"wrote {path}: {len(sd)} tensors, {total:,} elements, {os.path.getsize(path) / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
