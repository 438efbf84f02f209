"""Lightning, instrumented by one callback:

    from collector.integrations.lightning import RankscopeCallback
    trainer = lightning.Trainer(..., callbacks=[RankscopeCallback(run="my-job")])

At ``setup`` it attaches the hook (unless the script already did; the process group exists by
then); ``trainer.global_step`` is the step (an engine counter, collector.rank.steps: optimizer
steps, so ``accumulate_grad_batches`` is counted right); after each optimizer step every numeric
``self.log(...)`` value of the module (``trainer.callback_metrics``) goes to ``monitor`` at that
step, once per step. At ``teardown`` it detaches what it attached.
"""

from __future__ import annotations

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package of the same framework
    from pytorch_lightning.callbacks import Callback

from collector.rank import hook, steps


class RankscopeCallback(Callback):
    def __init__(self, run: str | None = None, endpoint: str | None = None, token: str | None = None) -> None:
        self.run, self.endpoint, self.token = run, endpoint, token
        self._attached_here = False
        self._last_step = 0

    def setup(self, trainer, pl_module, stage: str) -> None:
        if not hook.is_attached():
            hook.attach(run=self.run, endpoint=self.endpoint, token=self.token)
            self._attached_here = True

    def on_train_start(self, trainer, pl_module) -> None:
        steps.engine_in_use()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step <= self._last_step:  # a micro-batch of gradient accumulation: the step is not over
            return
        self._last_step = step
        steps.engine_stepped(step)
        values = {}
        for name, value in trainer.callback_metrics.items():
            if getattr(value, "numel", lambda: 1)() == 1:
                values[name] = float(value)
        if values:
            hook.log(values, step=step)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self._attached_here:
            hook.detach()
            self._attached_here = False
