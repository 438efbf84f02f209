"""A Hugging Face Trainer script with the rankscope callback, on a tiny GPT-2 built from a config
(nothing downloaded): 6 optimizer steps of 2 accumulated micro-batches, logging every step.
Run by tests/integration/rank/test_integrations.py: ``torchrun --nproc-per-node 2 _hf_trainer_script.py OUT``.
Each rank writes ``OUT/rank<r>.json``: the run id, the Trainer's global_step and log history."""

import json
import os
import sys
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from collector.integrations.huggingface import RankscopeCallback
from collector.rank import session
from collector.testing import flight_recorder
from collector.testing.workloads.framework_faults import SlowRankAndClock, steps

STEPS, ACCUM, VOCAB, LENGTH = steps(6), 2, 64, 16


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return max(256, 2 * 2 * ACCUM * STEPS)  # 2 ranks x batch 2: the run fits in one epoch

    def __getitem__(self, i):
        ids = torch.randint(0, VOCAB, (LENGTH,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


class RunId(TrainerCallback):
    """Notes the run id while the session is live (the rankscope callback detaches at the end)."""

    run_id = None

    def on_step_end(self, args, state, control, **kwargs):
        RunId.run_id = session.active().run_id


class Fault(TrainerCallback):
    """The fault suite's slow rank and step clock (collector/testing/workloads/framework_faults.py)."""

    def __init__(self, rank: int):
        self.clock = SlowRankAndClock(rank)

    def on_step_begin(self, args, state, control, **kwargs):
        self.clock.before_step(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        self.clock.after_step()


def main(out: Path) -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=1, n_head=2))
    args = TrainingArguments(
        output_dir=str(out / "hf"),
        run_name="hf-tiny",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=ACCUM,
        max_steps=STEPS,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        save_strategy="no",
        disable_tqdm=True,
    )
    fault = Fault(int(os.environ.get("RANK", 0)))
    callbacks = [RankscopeCallback(), RunId(), fault]
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=callbacks)
    trainer.train()
    rank = torch.distributed.get_rank()
    fault.clock.write(out)
    result = {"run_id": RunId.run_id, "global_step": trainer.state.global_step, "log": trainer.state.log_history}
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    if os.environ.get("TORCH_FR_BUFFER_SIZE"):  # the identity oracle (tests/integration/rank/test_integrations.py)
        flight_recorder.dump(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
