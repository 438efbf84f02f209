"""A DeepSpeed training script as users write one, plus ``hook.attach()`` at the top: ZeRO-2 (ZeRO-3
with RANKSCOPE_TEST_ZERO_STAGE=3), fp16
with dynamic loss scaling from 2^24 (so the first steps overflow and are skipped, then it trains), csv_monitor on,
gradient accumulation 2. Run in the DeepSpeed venv under torchrun by tests/integration/rank/test_deepspeed_hook.py:

    torchrun --nproc-per-node 2 tests/integration/rank/_deepspeed_hook_script.py OUT_DIR

Each rank writes ``OUT_DIR/rank<r>.json``: the run id and DeepSpeed's ``global_steps`` and
``skipped_steps`` after each ``engine.step()`` at a gradient-accumulation boundary.

DeepSpeed refuses fp16 on a CPU without mkldnn fp16 kernels ("Type fp16 is not supported on your
device"); torch's CPU half kernels run this model fine, so where that check would refuse, the
script lifts it. That line is the test environment's, not part of what is tested.
"""

import json
import os
import sys
from pathlib import Path

from collector import hook

STAGE = int(os.environ.get("RANKSCOPE_TEST_ZERO_STAGE", "2"))  # 3: the identity test's ZeRO-3 run
hook.attach(run=f"ds-zero{STAGE}-fp16")

import deepspeed  # noqa: E402  (after attach on purpose: the patches wait for DeepSpeed's import)
import torch  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402

STEPS, ACCUM = 8, 2


def main(out: Path) -> None:
    accelerator = get_accelerator()
    if not accelerator.is_fp16_supported():
        accelerator.is_fp16_supported = lambda: True  # the environment, not the test: see the docstring
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": ACCUM,
        "steps_per_print": 1000,
        "zero_optimization": {"stage": STAGE},
        "zero_allow_untested_optimizer": True,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "fp16": {"enabled": True, "initial_scale_power": 24, "loss_scale_window": 1000, "hysteresis": 1},
        "csv_monitor": {"enabled": True, "output_path": str(out / "csv"), "job_name": "job"},
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    rank = torch.distributed.get_rank()
    after_steps = []
    for step in range(STEPS * ACCUM):
        x = torch.randn(2, 16, generator=torch.Generator().manual_seed(step * 10 + rank)).half()
        loss = engine(x).float().pow(2).mean()
        engine.backward(loss)
        boundary = engine.is_gradient_accumulation_boundary()
        engine.step()
        if boundary:
            after_steps.append({"global_steps": engine.global_steps, "skipped_steps": engine.skipped_steps})
    from collector.rank import session

    run_id = session.active().run_id
    if os.environ.get("TORCH_FR_BUFFER_SIZE"):  # the identity oracle (tests/integration/rank/test_deepspeed_hook.py)
        from collector.testing import flight_recorder

        flight_recorder.dump(out)
    hook.detach()
    (out / f"rank{rank}.json").write_text(json.dumps({"run_id": run_id, "after_steps": after_steps}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    os._exit(0)  # DeepSpeed's atexit handlers on CPU can hang on gloo teardown
