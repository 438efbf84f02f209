"""A Lightning script with the rankscope callback: a tiny regression module, 5 optimizer steps of
2 accumulated batches on 2 CPU ranks (DDP over gloo). Run by tests/integration/rank/test_integrations.py:
``torchrun --nproc-per-node 2 _lightning_script.py OUT``. Each rank writes ``OUT/rank<r>.json``:
the run id, the trainer's global_step and the loss it logged last in each optimizer step."""

import json
import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

from collector.integrations.lightning import RankscopeCallback
from collector.rank import session
from collector.testing import flight_recorder
from collector.testing.workloads.framework_faults import SlowRankAndClock, steps

STEPS, ACCUM = steps(5), 2


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.last_loss: dict[int, float] = {}  # optimizer step (1-based) -> the last loss logged in it
        self.run_id = None
        self.fault = SlowRankAndClock(int(os.environ.get("RANK", 0)))  # the fault suite's slow rank and clock

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        self.last_loss[self.trainer.global_step + 1] = loss.item()
        self.run_id = session.active().run_id
        return loss

    def on_train_batch_start(self, batch, batch_idx):
        if batch_idx % ACCUM == 0:  # an optimizer step's first forward
            self.fault.before_step(self.trainer.global_step)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if (batch_idx + 1) % ACCUM == 0:
            self.fault.after_step()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(out: Path) -> None:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(max(64, 16 * STEPS), 8), torch.randn(max(64, 16 * STEPS), 1))
    module = Tiny()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=STEPS,
        accumulate_grad_batches=ACCUM,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[RankscopeCallback(run="lightning-tiny")],
    )
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    module.fault.write(out)
    result = {"run_id": module.run_id, "global_step": trainer.global_step, "last_loss": module.last_loss}
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))
    if os.environ.get("TORCH_FR_BUFFER_SIZE"):  # the identity oracle (tests/integration/rank/test_integrations.py)
        flight_recorder.dump(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
