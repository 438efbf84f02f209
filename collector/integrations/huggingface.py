"""The Hugging Face ``transformers`` Trainer, instrumented by one callback:

    from collector.integrations.huggingface import RankscopeCallback
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[RankscopeCallback()])

At ``on_train_begin`` it attaches the hook (unless the script already did), named
``args.run_name`` when set; the Trainer's ``global_step`` is the step (an engine counter,
collector.rank.steps), so gradient accumulation and skipped fp16 steps count as the Trainer
counts them; every numeric value of every ``on_log`` (loss, learning_rate, grad_norm, eval_*)
goes to ``monitor`` at that ``global_step``. At ``on_train_end`` it detaches what it attached.
"""

from __future__ import annotations

import numbers

from transformers import TrainerCallback

from collector.rank import hook, steps


class RankscopeCallback(TrainerCallback):
    def __init__(self, run: str | None = None, endpoint: str | None = None, token: str | None = None) -> None:
        self.run, self.endpoint, self.token = run, endpoint, token
        self._attached_here = False

    def on_train_begin(self, args, state, control, **kwargs):
        if not hook.is_attached():
            hook.attach(run=self.run or args.run_name or None, endpoint=self.endpoint, token=self.token)
            self._attached_here = True
        steps.engine_in_use()

    def on_step_end(self, args, state, control, **kwargs):
        steps.engine_stepped(state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        numbers_only = {
            k: v for k, v in (logs or {}).items() if isinstance(v, numbers.Real) and not isinstance(v, bool)
        }
        if numbers_only:
            hook.log(numbers_only, step=state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if self._attached_here:
            hook.detach()
            self._attached_here = False
