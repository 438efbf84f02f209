"""The issue-46 script's cases on real DeepSpeed (run by test_pipe_numerics in the DeepSpeed venv, side by side
with the bundled engine):

    torchrun --nproc-per-node 2 _deepspeed_pipe_numerics.py OUT CASES_JSON

Each case (test_pipe_numerics.case: 2 stages, fp32, ZeRO 0) trains STEPS train_batch calls on the same
layers and data; rank r writes ``OUT/rank<r>.json``: {case name: losses}.
"""

import json
import sys
from pathlib import Path

import deepspeed
import deepspeed.pipe
import torch

from tests.integration.trainer._pipe_numerics_model import MICRO, SEED, STEPS, global_batch, layer_specs, loss_fn


def run(case: dict) -> list[float]:
    torch.manual_seed(99)
    net = deepspeed.pipe.PipelineModule(
        layers=layer_specs(case["tied"], deepspeed.pipe),
        num_stages=case["stages"],
        loss_fn=loss_fn,
        partition_method=case["partition"],
        seed_layers=True,
        base_seed=SEED,
    )
    config = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": case["gas"],
        "optimizer": case["optimizer"],
        "steps_per_print": 10**9,
    }
    if case["clip"] is not None:
        config["gradient_clipping"] = case["clip"]
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
    losses = []
    for step in range(STEPS):
        x, y = global_batch(step, case["gas"] * MICRO)
        x, y = x.view(case["gas"], MICRO, -1), y.view(case["gas"], MICRO, -1)
        losses.append(float(engine.train_batch(iter([(x[k], y[k]) for k in range(case["gas"])]))))
    return losses


def main(out: Path, cases: list[dict]) -> None:
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    result = {case["name"]: run(case) for case in cases}
    (out / f"rank{torch.distributed.get_rank()}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), json.loads(sys.argv[2]))
