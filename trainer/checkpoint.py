"""Checkpoints in DeepSpeed's layout: each rank writes its own partition.

    save_dir/
      latest                                       # the newest tag, written last by rank 0
      <tag>/mp_rank_<t>_model_states.pt            # data-parallel rank 0 of tensor-parallel rank t:
                                                   #   module state (resident tensors), steps, scheduler
      <tag>/zero_pp_rank_<d>_mp_rank_<t>_optim_states.pt
                                                   # data-parallel rank d: fp32 master partition,
                                                   #   optimizer state, loss scaler, RNG states

Loading needs the same world size and ZeRO stage (the partitions are
per-rank); the parameters are rebuilt from the fp32 masters, so training
continues exactly where it stopped.
"""
from __future__ import annotations

import os
import random

import torch

from trainer import comm

LATEST = "latest"


def _model_file(ckpt_dir: str, tp_rank: int) -> str:
    return os.path.join(ckpt_dir, f"mp_rank_{tp_rank:02d}_model_states.pt")


def _optim_file(ckpt_dir: str, dp_rank: int, tp_rank: int) -> str:
    return os.path.join(ckpt_dir, f"zero_pp_rank_{dp_rank}_mp_rank_{tp_rank:02d}_optim_states.pt")


def _rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np
        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np
        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _resident_state(engine) -> dict:
    """The module's state_dict minus ZeRO-3 partitioned parameters (those live in the masters)."""
    return {k: v for k, v in engine.module.state_dict().items() if v.numel() > 0}


def save_checkpoint(engine, save_dir, tag=None, client_state: dict | None = None) -> str:
    """Write this rank's partition (collective: every rank must call it). Returns the tag directory."""
    tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    ckpt_dir = os.path.join(os.fspath(save_dir), tag)
    os.makedirs(ckpt_dir, exist_ok=True)
    comm.barrier(log_name="checkpoint.mkdir")
    if engine.dp_rank == 0:
        torch.save({
            "module": _resident_state(engine),
            "global_steps": engine.global_steps, "global_samples": engine.global_samples,
            "micro_steps": engine.micro_steps, "skipped_steps": engine.skipped_steps,
            "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None,
            "world_size": engine.world_size, "zero_stage": engine.zero_optimization_stage(),
            "ds_config": engine.config.raw, "client_state": client_state or {},
        }, _model_file(ckpt_dir, engine.tp_rank))
    torch.save({"optimizer_state_dict": engine.optimizer.state_dict(), "rng": _rng_state()},
               _optim_file(ckpt_dir, engine.dp_rank, engine.tp_rank))
    comm.barrier(log_name="checkpoint.written")
    if engine.rank == 0:
        tmp = os.path.join(os.fspath(save_dir), LATEST + ".tmp")
        with open(tmp, "w") as f:
            f.write(tag)
        os.replace(tmp, os.path.join(os.fspath(save_dir), LATEST))
    comm.barrier(log_name="checkpoint.latest")
    return ckpt_dir


def load_checkpoint(engine, load_dir, tag=None):
    """Restore this rank's partition; returns ``(tag_dir, client_state)`` like DeepSpeed,
    or ``(None, None)`` when ``load_dir`` has no checkpoint."""
    load_dir = os.fspath(load_dir)
    if tag is None:
        latest = os.path.join(load_dir, LATEST)
        if not os.path.isfile(latest):
            return None, None
        with open(latest) as f:
            tag = f.read().strip()
    ckpt_dir = os.path.join(load_dir, str(tag))
    model_file = _model_file(ckpt_dir, engine.tp_rank)
    optim_file = _optim_file(ckpt_dir, engine.dp_rank, engine.tp_rank)
    for path in (model_file, optim_file):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"checkpoint file {path} is missing (was it written with "
                                    f"{engine.world_size} ranks?)")
    model_state = torch.load(model_file, map_location="cpu", weights_only=False)
    if model_state["world_size"] != engine.world_size or model_state["zero_stage"] != engine.zero_optimization_stage():
        raise ValueError(f"checkpoint {ckpt_dir} was written by ZeRO stage {model_state['zero_stage']} on "
                         f"{model_state['world_size']} ranks; this engine runs stage "
                         f"{engine.zero_optimization_stage()} on {engine.world_size} ranks")
    result = engine.module.load_state_dict(model_state["module"], strict=False)
    partitioned = {k for k, v in engine.module.state_dict().items() if v.numel() == 0}
    if result.unexpected_keys or set(result.missing_keys) - partitioned:
        raise ValueError(f"checkpoint {ckpt_dir} does not match this model: missing "
                         f"{sorted(set(result.missing_keys) - partitioned)}, unexpected {result.unexpected_keys}")
    optim_state = torch.load(optim_file, map_location="cpu", weights_only=False)
    engine.optimizer.load_state_dict(optim_state["optimizer_state_dict"])
    if engine.lr_scheduler is not None and model_state["lr_scheduler"] is not None:
        engine.lr_scheduler.load_state_dict(model_state["lr_scheduler"])
    for k in ("global_steps", "global_samples", "micro_steps", "skipped_steps"):
        setattr(engine, k, model_state[k])
    _set_rng_state(optim_state["rng"])
    engine.after_checkpoint_load()
    return ckpt_dir, model_state["client_state"]
