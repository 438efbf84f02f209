"""test_pipe_numerics' cases on real DeepSpeed (run in the DeepSpeed venv, side by side with the bundled engine):

    torchrun --nproc-per-node N _deepspeed_pipe_numerics.py OUT CASES_JSON

Each case (test_pipe_numerics.case: fp32; stages, partition, gas, optimizer, scheduler, clipping, tied layers,
activation checkpointing, ZeRO stage) trains STEPS train_batch calls on the same layers and data, each data-parallel
replica its slice of the global batch as the bundled side reads it; rank r writes ``OUT/rank<r>.json``:
{case name: losses}.
"""

import json
import sys
from pathlib import Path

import deepspeed
import deepspeed.pipe
import deepspeed.runtime.utils as ds_utils
import torch

from tests.integration.trainer._pipe_numerics_model import MICRO, SEED, STEPS, global_batch, layer_specs, loss_fn

# DeepSpeed 0.19.8 seeds layer i with base_seed + a numpy integer where the partition is not uniform, which
# Python 3.11's random.seed refuses (TypeError): the same seed, as an int
_seed = ds_utils.set_random_seed
ds_utils.set_random_seed = lambda seed: _seed(int(seed))


def run(case: dict, world: int) -> list[float]:
    torch.manual_seed(99)
    net = deepspeed.pipe.PipelineModule(
        layers=layer_specs(case["tied"], deepspeed.pipe),
        num_stages=case["stages"],
        loss_fn=loss_fn,
        partition_method=case["partition"],
        seed_layers=True,
        base_seed=SEED,
        activation_checkpoint_interval=case["checkpoint_interval"],
    )
    dp, gas = world // case["stages"], case["gas"]
    config = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": gas,
        "optimizer": case["optimizer"],
        "zero_optimization": {"stage": case["zero"]},
        "zero_allow_untested_optimizer": True,  # torch's SGD under ZeRO-1 (DeepSpeed asks to be told)
        "steps_per_print": 10**9,
    }
    if case["clip"] is not None:
        config["gradient_clipping"] = case["clip"]
    if case["scheduler"] is not None:
        config["scheduler"] = case["scheduler"]
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
    d = engine.grid.get_data_parallel_rank()
    losses = []
    for step in range(STEPS):
        x, y = global_batch(step, dp * gas * MICRO)
        x, y = x.view(dp, gas, MICRO, -1)[d], y.view(dp, gas, MICRO, -1)[d]
        losses.append(float(engine.train_batch(iter([(x[k], y[k]) for k in range(gas)]))))
    return losses


def main(out: Path, cases: list[dict]) -> None:
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    world = torch.distributed.get_world_size()
    result = {case["name"]: run(case, world) for case in cases}
    (out / f"rank{torch.distributed.get_rank()}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), json.loads(sys.argv[2]))
