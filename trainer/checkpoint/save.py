"""Writing a checkpoint: every rank its shard file in parallel, rank 0 the index last.

    1. rank 0 empties the tag folder's index and shards (a re-save of a tag)     agree
    2. every rank writes shards/rank_<R>.pt: its fragments, buffers it owns, RNG  gather metadata to rank 0
    3. rank 0 writes engine_states.pt, client_state.pt, then checkpoint.json     agree
    4. rank 0 points ``latest`` at the tag (save_latest)                          agree

"agree" is an all_gather of each rank's error (or None): a rank that fails to
write (disk full, permissions) makes every rank raise the same CheckpointError
instead of leaving the others waiting in the next collective. Until step 3 ends
the tag has no checkpoint.json, so a save cut short is never mistaken for a
checkpoint; ``latest`` moves only to a complete one.

Buffers and frozen parameters are written by one holder each: the first
data-parallel rank for dense ones, the first rank of the expert-data-parallel
group for an expert's. No rank gathers parameters or optimizer state.
"""

from __future__ import annotations

import os
import random
import shutil
from collections import defaultdict

import torch

from trainer import comm
from trainer.checkpoint.fragments import bucket_fragments
from trainer.checkpoint.layout import (
    CLIENT_STATE,
    ENGINE_STATES,
    FORMAT,
    INDEX,
    SHARDS,
    VERSION,
    CheckpointError,
    default_tag,
    save_json,
    save_torch,
    shard_file,
    write_latest,
)
from trainer.checkpoint.names import ModelNames, model_names
from trainer.checkpoint.optimizer_state import group_options, optimizer_type, per_element_state, step_of


def agree(error: str | None, what: str) -> None:
    """Collective: raise the same CheckpointError on every rank when any rank reports an error."""
    errors: list = [None] * comm.get_world_size()
    comm.all_gather_object(errors, error)
    failed = [(r, e) for r, e in enumerate(errors) if e]
    if failed:
        rank, message = failed[0]
        more = f" (and on {len(failed) - 1} more ranks)" if len(failed) > 1 else ""
        raise CheckpointError(f"{what} failed on rank {rank}: {message}{more}")


def _describe(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename:
        return f"{e.filename}: {e.strerror or e}"
    return f"{type(e).__name__}: {e}" if not isinstance(e, CheckpointError) else str(e)


def rng_state() -> dict:
    """This process's RNG states, as tensors and plain values (loadable with weights_only)."""
    version, internal, gauss = random.getstate()
    state = {"python": [version, list(internal), gauss], "torch": torch.get_rng_state()}
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached]
    except ImportError:
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _trainable(engine) -> set[int]:
    return {id(s.param) for b in engine.optimizer.buckets for s in b.slots}


def _writes_resident(engine, names: ModelNames, name: str) -> bool:
    if name in names.expert_groups:
        group = names.expert_groups[name]
        return group is None or comm.get_rank(group) == 0
    return engine.dp_rank == 0


def _write_shard(engine, tag_dir: str, names: ModelNames) -> dict:
    """Write this rank's shard file; returns what the index needs to know about it."""
    opt = engine.optimizer
    fragments, shapes, state_keys = {}, {}, set()
    with opt.materialized(modified=False) as pairs:
        inner = opt.master.optimizer
        for b, master in pairs:
            state = inner.state.get(master, {})
            per_element = per_element_state(state, master)
            state_keys.update(per_element)
            group_rank = comm.get_rank(b.group) if b.num_shards == 1 and b.group_size > 1 else 0
            fragments.update(bucket_fragments(b, master, per_element, step_of(state), names.params, group_rank))
            for s in b.slots:
                shapes[names.params[id(s.param)]] = (
                    list(s.shape),
                    str(s.param.dtype).removeprefix("torch."),
                    b.group_index,
                )
        # a pipeline's tied weight lives on several stages: only the first of them writes it
        saved_elsewhere = getattr(engine, "saved_elsewhere", None)
        if saved_elsewhere is not None:
            fragments = {n: f for n, f in fragments.items() if not saved_elsewhere(n)}
        tensors = {
            n: t.cpu() for n, t in {**names.buffers, **names.frozen}.items() if _writes_resident(engine, names, n)
        }
        rel = shard_file(engine.rank)
        save_torch(
            {"rank": engine.rank, "fragments": fragments, "tensors": tensors, "rng": rng_state()},
            os.path.join(tag_dir, rel),
        )
    own_order = engine.dp_rank == 0 or bool(names.expert_groups)  # dense-only ranks repeat dp rank 0's order
    return {
        "tp_rank": engine.tp_rank,
        "file": rel,
        "state_keys": sorted(state_keys),
        "fragments": {n: (f["offset"], f["fp32"].numel()) for n, f in fragments.items()},
        "shapes": {n: shapes[n] for n in fragments},
        "buffers": [n for n in tensors if n in names.buffers],
        "frozen": [n for n in tensors if n in names.frozen],
        "aliases": names.aliases if own_order else {},
        "order": names.order if own_order else [],
    }


def merge_orders(lists: list[list[str]]) -> list[str]:
    """One list holding every name, each list's relative order kept: names new to the result go
    just before the next name of their list that the result already has (another rank's experts
    land after this rank's, before the layer that follows them)."""
    out: list[str] = []
    seen: set[str] = set()
    for names in lists:
        pending: list[str] = []
        for name in names:
            if name not in seen:
                pending.append(name)
            elif pending:
                at = out.index(name)
                out[at:at] = pending
                seen.update(pending)
                pending = []
        out += pending
        seen.update(pending)
    return out


def build_index(metas: list[dict], tp_size: int) -> tuple[list[dict], list[str]]:
    """``mp_ranks`` of the index from every rank's shard metadata, and the union of state keys.
    Checks every parameter is covered exactly once (a save that lost a piece is refused)."""
    mp_ranks = [{"parameters": {}, "aliases": {}, "buffers": {}, "frozen": {}, "order": []} for _ in range(tp_size)]
    orders: dict[int, list] = defaultdict(list)
    state_keys: set[str] = set()
    for meta in metas:
        entry = mp_ranks[meta["tp_rank"]]
        state_keys.update(meta["state_keys"])
        for name, (offset, numel) in meta["fragments"].items():
            shape, dtype, group = meta["shapes"][name]
            param = entry["parameters"].setdefault(
                name, {"shape": shape, "dtype": dtype, "group": group, "fragments": []}
            )
            param["fragments"].append([meta["file"], offset, numel])
        for kind in ("buffers", "frozen"):
            for name in meta[kind]:
                entry[kind].setdefault(name, meta["file"])
        entry["aliases"].update(meta["aliases"])
        if meta["order"]:
            orders[meta["tp_rank"]].append(meta["order"])
    for t, entry in enumerate(mp_ranks):
        entry["order"] = merge_orders(orders[t])
        position = {name: i for i, name in enumerate(entry["order"])}
        entry["parameters"] = dict(
            sorted(entry["parameters"].items(), key=lambda kv: position.get(kv[0], len(position)))
        )
        for name, param in entry["parameters"].items():
            param["fragments"].sort(key=lambda f: f[1])
            numel, end = 1, 0
            for d in param["shape"]:
                numel *= d
            for _, offset, n in param["fragments"]:
                if offset != end:
                    raise CheckpointError(f"parameter {name}: fragments leave a gap or overlap at element {end}")
                end = offset + n
            if end != numel:
                raise CheckpointError(f"parameter {name}: fragments cover {end} of {numel} elements")
    return mp_ranks, sorted(state_keys)


def _written_by(engine) -> dict:
    from trainer.moe import MoE

    zero = engine.config.zero_optimization
    return {
        "world_size": engine.world_size,
        "dp_world_size": engine.dp_world_size,
        "tp_size": engine.config.tensor_parallel.tp_size,
        "zero_stage": zero.stage,
        "offload_optimizer": zero.offload_optimizer.device,
        "offload_param": zero.offload_param.device,
        "precision": str(engine.config.precision).removeprefix("torch."),
        "moe": [
            {"module": n, "num_experts": m.num_experts, "ep_size": m.ep_size}
            for n, m in engine.module.named_modules()
            if isinstance(m, MoE)
        ],
    }


def _prepare(tag_dir: str) -> None:
    """Rank 0: an empty shards folder and no index (a re-save of a tag must not mix files)."""
    os.makedirs(tag_dir, exist_ok=True)
    index = os.path.join(tag_dir, INDEX)
    if os.path.exists(index):
        os.unlink(index)
    shutil.rmtree(os.path.join(tag_dir, SHARDS), ignore_errors=True)
    os.makedirs(os.path.join(tag_dir, SHARDS))


def _check_tag(tag: str) -> str:
    if not tag or tag in (".", "..") or "/" in tag or os.sep in tag:
        raise CheckpointError(f"checkpoint tag {tag!r} must be a plain folder name (no path separators)")
    return tag


def save_checkpoint(engine, save_dir, tag=None, client_state: dict | None = None, save_latest: bool = True) -> str:
    """Write a checkpoint of ``engine`` under ``save_dir/tag`` (collective: every rank calls it).
    Returns the tag folder."""
    save_dir = os.fspath(save_dir)
    tag = _check_tag(str(tag) if tag is not None else default_tag(engine.global_steps))
    tag_dir = os.path.join(save_dir, tag)
    what = f"saving checkpoint {tag_dir}"
    error = None
    if engine.rank == 0:
        try:
            _prepare(tag_dir)
        except OSError as e:
            error = _describe(e)
    agree(error, what)

    names = model_names(engine.module, _trainable(engine))
    meta, error = None, None
    try:
        meta = _write_shard(engine, tag_dir, names)
    except Exception as e:
        error = _describe(e)
    metas: list = [None] * comm.get_world_size() if engine.rank == 0 else None
    comm.gather_object((meta, error), metas, dst=0)
    if engine.rank == 0:
        error = None if all(m for m, _ in metas) else "a rank could not write its shard"
        if error is None:
            try:
                _write_rank0_files(engine, tag_dir, tag, [m for m, _ in metas], client_state)
            except Exception as e:
                error = _describe(e)
    agree(error, what)
    if save_latest:
        error = None
        if engine.rank == 0:
            try:
                write_latest(save_dir, tag)
            except OSError as e:
                error = _describe(e)
        agree(error, f"pointing {save_dir}/latest at {tag}")
    return tag_dir


def _write_rank0_files(engine, tag_dir: str, tag: str, metas: list[dict], client_state) -> None:
    inner = engine.optimizer.master.optimizer
    mp_ranks, state_keys = build_index(metas, engine.config.tensor_parallel.tp_size)
    sampler = getattr(engine, "data_sampler", None)
    save_torch(
        {
            "param_groups": group_options(inner),
            "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None,
            "loss_scaler": engine.loss_scaler.state_dict() if engine.loss_scaler is not None else None,
            "data_sampler": sampler.state_dict() if sampler is not None else None,
        },
        os.path.join(tag_dir, ENGINE_STATES),
    )
    save_torch(dict(client_state or {}), os.path.join(tag_dir, CLIENT_STATE))
    save_json(
        {
            "format": FORMAT,
            "version": VERSION,
            "tag": tag,
            "written_by": _written_by(engine),
            "engine": {
                "global_steps": engine.global_steps,
                "global_samples": engine.global_samples,
                "skipped_steps": engine.skipped_steps,
            },
            "optimizer": {"type": optimizer_type(inner), "state": state_keys, "param_groups": len(inner.param_groups)},
            "mp_ranks": mp_ranks,
        },
        os.path.join(tag_dir, INDEX),
    )
