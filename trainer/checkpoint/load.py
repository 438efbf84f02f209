"""Loading a checkpoint into an engine of any world size, ZeRO stage 0-3, offload and ep_size.

    1. read checkpoint.json and check it against this engine: tensor-parallel size, optimizer
       type and param groups, every parameter's and buffer's name and shape -- nothing changes yet
    2. read what this rank holds: for each bucket the elements of its master (its shard, or the
       whole bucket when replicated), values and optimizer moments, from whichever fragments
       overlap them (memory-mapped shard files: only those pages are read)
    3. agree: if any rank failed 1-2, every rank raises the same CheckpointError, so a checkpoint
       that does not fit leaves every engine as it was and no rank waits in a collective
    4. apply: masters and optimizer state, param-group options; parameters rebuilt from the
       masters (a collective); buffers; lr scheduler, loss scaler, step counters, data sampler;
       RNG states only on the world size that wrote them (another world has other ranks)

Nothing here depends on the writer's layout: ranks, buckets and shards are this
engine's own, the checkpoint is looked up by parameter name (trainer.checkpoint.names).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import torch

from trainer import comm
from trainer.checkpoint.fragments import FragmentSource, runs
from trainer.checkpoint.layout import (
    CLIENT_STATE,
    ENGINE_STATES,
    CheckpointError,
    load_torch,
    read_index,
    resolve_tag_dir,
    shard_file,
)
from trainer.checkpoint.names import ModelNames, model_names
from trainer.checkpoint.optimizer_state import optimizer_type, restore_group_options, step_value


@dataclass
class _Staged:
    """What one rank read, before anything in the engine changes."""

    index: dict
    masters: list[torch.Tensor]  # per bucket, [shard_numel] fp32
    states: list[dict[str, torch.Tensor] | None]  # per bucket: per-element optimizer state (None: fresh)
    steps: list[float | None]
    resident: dict[str, tuple[torch.Tensor, torch.Tensor]]  # name -> (the module's tensor, saved value)
    engine_states: dict
    client_state: dict
    rng: dict | None


def _shape_of_model(engine, names: ModelNames) -> dict[str, list[int]]:
    shapes = {names.params[id(s.param)]: list(s.shape) for b in engine.optimizer.buckets for s in b.slots}
    shapes.update({n: list(t.shape) for n, t in {**names.buffers, **names.frozen}.items()})
    return shapes


def check_fits(entry: dict, names: ModelNames, shapes: dict[str, list[int]], tag_dir: str, elsewhere=None) -> None:
    """One CheckpointError naming the first parameter or buffer (in module order) that the
    checkpoint lacks or holds with another shape, else the first it holds that the model lacks
    (``elsewhere(name)``: held by another rank's part of the model, a pipeline's other stages)."""
    saved: dict[str, list[int]] = {n: p["shape"] for n, p in entry["parameters"].items()}
    problems = []
    for name in names.order:
        if name in names.aliases:
            continue
        if name in names.buffers:
            if name not in entry["buffers"]:
                problems.append(f"buffer {name} of this model is not in the checkpoint")
            continue
        if name not in saved and name in entry["frozen"]:
            continue  # frozen both times; its shape is checked when read
        if name not in saved:
            problems.append(f"parameter {name} of this model is not in the checkpoint")
        elif saved[name] != shapes[name]:
            problems.append(f"parameter {name} has shape {saved[name]} in the checkpoint, {shapes[name]} in this model")
    mine = set(names.order)
    for name in entry["order"]:
        if (
            name not in mine
            and name not in entry["aliases"]
            and not names.is_other_ranks_expert(name)
            and not (elsewhere and elsewhere(name))
        ):
            problems.append(f"the checkpoint holds {name}, which this model does not have")
    if problems:
        more = f" ({len(problems) - 1} more differences)" if len(problems) > 1 else ""
        raise CheckpointError(f"checkpoint {tag_dir} does not fit this model: {problems[0]}{more}")


def _check_engine(engine, index: dict, tag_dir: str, load_optimizer_states: bool) -> None:
    written = index["written_by"]
    tp = engine.config.tensor_parallel.tp_size
    if written["tp_size"] != tp:
        raise CheckpointError(
            f"checkpoint {tag_dir} was written with tensor_parallel.tp_size {written['tp_size']}, "
            f"this engine runs tp_size {tp}: tensor-parallel shards are not re-split on load"
        )
    if not load_optimizer_states:
        return
    inner = engine.optimizer.master.optimizer
    saved, mine = index["optimizer"]["type"], optimizer_type(inner)
    if saved != mine:
        raise CheckpointError(
            f"checkpoint {tag_dir} holds {saved} optimizer state, this engine's optimizer is {mine}: "
            f"it cannot resume from it (load_optimizer_states=False loads the weights only)"
        )
    if index["optimizer"]["param_groups"] != len(inner.param_groups):
        raise CheckpointError(
            f"checkpoint {tag_dir} has {index['optimizer']['param_groups']} optimizer param "
            f"groups, this engine {len(inner.param_groups)}"
        )


def _stage(engine, tag_dir: str, load_optimizer_states: bool) -> _Staged:
    index = read_index(tag_dir)
    _check_engine(engine, index, tag_dir, load_optimizer_states)
    entry = index["mp_ranks"][engine.tp_rank]
    opt = engine.optimizer
    names = model_names(engine.module, {id(s.param) for b in opt.buckets for s in b.slots})
    check_fits(entry, names, _shape_of_model(engine, names), tag_dir, getattr(engine, "held_elsewhere", None))
    state_keys = index["optimizer"]["state"] if load_optimizer_states else []
    source = FragmentSource(tag_dir, entry["parameters"])
    try:
        masters, states, steps = [], [], []
        for b in opt.buckets:
            values = torch.zeros(b.shard_numel, dtype=torch.float32)
            state = {k: torch.zeros(b.shard_numel, dtype=torch.float32) for k in state_keys}
            seen = set()
            lo = b.shard_start
            for s, a, c in runs(b.slots, lo, lo + b.shard_numel):
                at = s.offset + a - lo
                views = {"fp32": values[at : at + c - a], **{k: t[at : at + c - a] for k, t in state.items()}}
                seen |= source.copy_into(names.params[id(s.param)], a, c, views)
            if len(seen) > 1:
                raise CheckpointError(
                    f"checkpoint {tag_dir}: parameters of one bucket were saved at different "
                    f"optimizer steps {sorted(x for x in seen if x is not None)}"
                )
            step = next(iter(seen)) if seen else None
            masters.append(values)
            steps.append(step)
            states.append(state if load_optimizer_states and (state or step is not None) else None)
        resident = {}
        for name, tensor in {**names.buffers, **names.frozen}.items():
            resident[name] = (tensor, _resident_value(source, entry, name, tensor, tag_dir))
        rng = None
        if index["written_by"]["world_size"] == engine.world_size:
            rng = source.shard(shard_file(engine.rank)).get("rng")
    finally:
        source.close()
    engine_states = load_torch(os.path.join(tag_dir, ENGINE_STATES))
    client_state = load_torch(os.path.join(tag_dir, CLIENT_STATE), trusted=True)
    return _Staged(index, masters, states, steps, resident, engine_states, client_state, rng)


def _resident_value(source: FragmentSource, entry: dict, name: str, tensor: torch.Tensor, tag_dir: str):
    """A buffer's or frozen parameter's saved value (a parameter trained then, frozen now, comes
    from its fp32 fragments)."""
    if name in entry["parameters"]:
        value = torch.empty(tensor.numel(), dtype=torch.float32)
        source.copy_into(name, 0, tensor.numel(), {"fp32": value})
        return value.view(tensor.shape)
    rel = entry["buffers"].get(name) or entry["frozen"].get(name)
    value = source.shard(rel)["tensors"].get(name) if rel is not None else None
    if value is None:
        raise CheckpointError(f"checkpoint {tag_dir}: {name} is missing from {rel}")
    if value.shape != tensor.shape:
        raise CheckpointError(
            f"checkpoint {tag_dir} does not fit this model: {name} has shape {list(value.shape)} "
            f"in the checkpoint, {list(tensor.shape)} in this model"
        )
    return value


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


@torch.no_grad()
def _apply(
    engine, staged: _Staged, load_optimizer_states: bool, load_lr_scheduler_states: bool, load_module_only: bool
) -> None:
    opt = engine.optimizer
    inner = opt.master.optimizer
    with opt.materialized(modified=True) as pairs:
        for (_b, master), values, state, step in zip(pairs, staged.masters, staged.states, staged.steps):
            master.copy_(values)
            if not load_optimizer_states:
                continue
            if state is None:
                inner.state.pop(master, None)
                continue
            inner.state[master] = {k: v.to(master.device) for k, v in state.items()}
            if step is not None:
                inner.state[master]["step"] = step_value(inner, step)
        if load_optimizer_states:
            restore_group_options(inner, staged.engine_states["param_groups"])
    for tensor, value in staged.resident.values():
        tensor.copy_(value)
    if load_module_only:
        return
    states = staged.engine_states
    if load_lr_scheduler_states and engine.lr_scheduler is not None and states["lr_scheduler"] is not None:
        engine.lr_scheduler.load_state_dict(states["lr_scheduler"])
    if engine.loss_scaler is not None and states["loss_scaler"] is not None:
        engine.loss_scaler.load_state_dict(states["loss_scaler"])
    sampler = getattr(engine, "data_sampler", None)
    if sampler is not None and states["data_sampler"] is not None:
        sampler.load_state_dict(states["data_sampler"])
    counters = staged.index["engine"]
    engine.global_steps = counters["global_steps"]
    engine.global_samples = counters["global_samples"]
    engine.skipped_steps = counters["skipped_steps"]
    engine.micro_steps = engine.global_steps * engine.gradient_accumulation_steps()
    if staged.rng is not None:
        set_rng_state(staged.rng)


def load_checkpoint(
    engine,
    load_dir,
    tag=None,
    *,
    load_optimizer_states: bool = True,
    load_lr_scheduler_states: bool = True,
    load_module_only: bool = False,
):
    """Resume ``engine`` from a checkpoint (collective: every rank calls it). Returns DeepSpeed's
    ``(tag folder, client_state)``, or ``(None, None)`` when ``load_dir`` holds no ``latest``."""
    load_optimizer_states = load_optimizer_states and not load_module_only
    tag_dir, staged, error = None, None, None
    try:
        tag_dir = resolve_tag_dir(load_dir, tag)
        if tag_dir is not None:
            staged = _stage(engine, tag_dir, load_optimizer_states)
    except CheckpointError as e:
        error = str(e)
    except OSError as e:
        error = f"{e.filename}: {e.strerror or e}" if e.filename else str(e)
    status: list = [None] * comm.get_world_size()
    comm.all_gather_object(status, (error, tag_dir is not None))
    if error is not None:
        raise CheckpointError(error)
    failed = [(r, e) for r, (e, _) in enumerate(status) if e]
    if failed:
        rank, message = failed[0]
        raise CheckpointError(f"loading the checkpoint failed on rank {rank}: {message}")
    found = {f for _, f in status}
    if found == {False}:
        return None, None
    if len(found) > 1:
        raise CheckpointError(
            f"{os.fspath(load_dir)}/latest is visible on some ranks only: the checkpoint must be "
            f"on a file system every rank can read"
        )
    _apply(engine, staged, load_optimizer_states, load_lr_scheduler_states, load_module_only)
    engine.after_checkpoint_load()
    return tag_dir, staged.client_state
