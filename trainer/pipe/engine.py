"""The pipeline engine: DeepSpeed's PipelineEngine API over trainer.Engine.

    loss = engine.train_batch(data_iter)   # gradient_accumulation_steps micro-batches, one optimizer step
    loss = engine.eval_batch(data_iter)

Each rank runs one stage of one pipeline (trainer.pipe.topology: rank = stage * (dp * tp) + data_rank * tp
+ tp_rank; a pipeline is the ranks of one (data_rank, tp_rank), so with tensor parallelism each of a
stage's tensor-parallel ranks talks to the same tensor-parallel rank of the next stage).
A step runs the 1F1B schedule (trainer.pipe.schedule) over m = gradient_accumulation_steps
micro-batches of train_micro_batch_size_per_gpu samples, or with ``PipelineModule(virtual_stages=v)``
Megatron's interleaved 1F1B over the stage's v chunks (the model's chunk c * p + s on stage s, so the
last stage's chunk sends to stage 0's next one): activations go forward and their gradients back with
the instrumented point-to-point ops (trainer.comm: isend to the neighbour, a blocking recv for what
this stage needs next, so the waits are the bubbles; activations and gradients on their own tags, as
both cross the same pair of ranks when chunks wrap), the loss is ``loss_fn(outputs, labels) / m`` on
the model's last chunk. After the last backward the tied weights'
gradients are summed over their stages, then the engine's ZeRO optimizer (stage 0 or 1) averages
gradients over the data-parallel replicas of the same stage and tensor-parallel rank and steps, as in a
non-pipelined step; clipping's norm counts every stage, each tensor-parallel shard, and a replicated
parameter once (trainer.zero.optimizer). Only the first stage reads inputs and only the last reads
labels from ``data_iter``, as in DeepSpeed; tensor-parallel peers read the same micro-batches.
Every step's per-stage timeline is sent as ``pipe`` rows (collector.rank.pipe_timeline; by tp_rank 0
only, as its tensor-parallel peers run the same schedule in lockstep), and the ``train_batch`` timer
spans the whole step on every stage (the rank's step for the step analysis).
"""

from __future__ import annotations

import torch
from torch import nn

from collector.rank.clock import perf_ns
from collector.rank.pipe_timeline import StageTimeline
from trainer import comm
from trainer.config import ConfigError
from trainer.engine import Engine
from trainer.pipe.module import PipelineError, PipelineModule
from trainer.pipe.schedule import BACKWARD, FORWARD, stage_schedule

# Wire codes for the dtypes of tensors crossing a stage boundary (sent once per batch with their shapes).
_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool]
_META_LEN = 64
# Point-to-point tags: with virtual stages, activations and gradients cross the same pair of ranks both
# ways, each stream in its own order.
_ACTIVATIONS, _GRADIENTS = 0, 1


class PipelineEngine(Engine):
    """trainer.initialize returns this for a PipelineModule. ZeRO stages 0 and 1 (DeepSpeed's limit too)."""

    def __init__(self, model: PipelineModule, config, **kw):
        if not isinstance(model, PipelineModule):
            raise PipelineError("PipelineEngine needs a trainer.pipe.PipelineModule")
        self.topology = model.topology
        super().__init__(model, config, **kw)
        if self.config.zero_optimization.stage > 1:
            raise ConfigError(
                f"zero_optimization.stage {self.config.zero_optimization.stage}: pipeline parallelism works "
                "with ZeRO stage 0 or 1 (gradients must stay whole across micro-batches), as in DeepSpeed"
            )
        if model.num_stages > 1 and model.loss_fn is None and model.stage_id == model.num_stages - 1:
            raise PipelineError("PipelineModule(loss_fn=...) is required to train with more than one stage")
        self.num_stages, self.stage_id = model.num_stages, model.stage_id
        interval = self.config.raw.get("pipeline", {}).get("activation_checkpoint_interval", 0)
        if not isinstance(interval, int) or isinstance(interval, bool) or interval < 0:
            raise ConfigError(f"pipeline.activation_checkpoint_interval: must be an integer >= 0 (got {interval!r})")
        if interval > 0:  # the config's wins over the module's, as in DeepSpeed
            model.set_checkpoint_interval(interval)
        self.micro_batches = self.gradient_accumulation_steps()
        self.virtual_stages = model.virtual_stages
        if self.virtual_stages > 1 and self.micro_batches % self.num_stages:
            raise ConfigError(
                f"gradient_accumulation_steps: {self.micro_batches} micro-batches; the interleaved schedule "
                f"(PipelineModule(virtual_stages={self.virtual_stages})) needs a multiple of num_stages "
                f"{self.num_stages}, as Megatron's does"
            )
        top = self.topology
        wraps = self.virtual_stages > 1  # the last stage's chunk feeds stage 0's next one
        first, last = self.stage_id == 0, self.stage_id == self.num_stages - 1
        self.prev_rank = top.rank_of((self.stage_id - 1) % self.num_stages) if wraps or not first else None
        self.next_rank = top.rank_of((self.stage_id + 1) % self.num_stages) if wraps or not last else None
        self.pipe_group, self.last_rank = model.groups.pipe, top.rank_of(self.num_stages - 1)
        self.timeline = StageTimeline(
            stage=self.stage_id,
            stages=self.num_stages,
            data_rank=top.data_rank,
            layers=model.num_local_layers,
            virtual_stages=self.virtual_stages,
        )
        self.last_pipe_columns: dict[str, list] = {}  # this rank's pipe rows of the last step
        self.data_iterator = None
        self.agg_train_loss = None

    # ---------------------------------------------------------------- layout (Engine's hooks)

    def _batch_world_size(self, model: nn.Module) -> int:
        return model.topology.data_parallel * model.topology.tensor_parallel  # one stage's ranks

    def _data_parallel_group(self, model: nn.Module, cfg) -> tuple[object, int]:
        top = model.topology
        if cfg.tensor_parallel.tp_size != top.tensor_parallel:
            cfg.tensor_parallel.fail(
                "tp_size", f"must equal the PipelineModule's tp_size {top.tensor_parallel}", cfg.tensor_parallel.tp_size
            )
        return model.groups.layers.dp_group, top.tp_rank

    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    def is_last_stage(self) -> bool:
        return self.stage_id == self.num_stages - 1

    def _is_first_chunk(self, chunk: int) -> bool:
        """Whether this stage's ``chunk`` is the model's first (it reads the inputs)."""
        return self.is_first_stage() and chunk == 0

    def _is_last_chunk(self, chunk: int) -> bool:
        """Whether this stage's ``chunk`` is the model's last (it computes the loss)."""
        return self.is_last_stage() and chunk == self.virtual_stages - 1

    def held_elsewhere(self, name: str) -> bool:
        """Whether a checkpoint's parameter or buffer ``name`` belongs to another stage's layers
        (names start with the global layer index, tied modules with ``tied_modules.<key>``)."""
        head, _, rest = name.partition(".")
        if head.isdigit():
            return not self.module.owns_layer(int(head))
        return head == "tied_modules" and rest.partition(".")[0] not in self.module.tied_modules

    def saved_elsewhere(self, name: str) -> bool:
        """Whether another stage writes parameter ``name`` to a checkpoint: a tied module's weight is
        written by the first stage sharing it (each stage holding a copy would overlap in the index)."""
        head, _, rest = name.partition(".")
        tie = self.module.tied_comms.get(rest.partition(".")[0]) if head == "tied_modules" else None
        return tie is not None and tie["ranks"][0] != self.rank

    def set_dataiterator(self, iterator) -> None:
        self.data_iterator = iterator

    def forward(self, *args, **kwargs):
        raise PipelineError("a pipeline engine runs only train_batch() and eval_batch()")

    def backward(self, *args, **kwargs):
        raise PipelineError("a pipeline engine runs only train_batch() and eval_batch()")

    # ---------------------------------------------------------------- training

    def train_batch(self, data_iter=None) -> torch.Tensor:
        """One optimizer step over ``gradient_accumulation_steps`` micro-batches from ``data_iter``
        (``(inputs, labels)`` each); returns the mean loss over them and the data-parallel replicas,
        on every stage."""
        if not torch.is_grad_enabled():
            raise RuntimeError("train_batch() requires gradients enabled. Use eval_batch() instead.")
        self.module.train()
        # The pipeline's step, on every stage: first forward (or the wait for it) to the optimizer's end;
        # _report stops it, so step charts, the step analysis and costs see the whole of it.
        self.timers.start("train_batch")
        batches = self._batches(data_iter)
        m = self.micro_batches
        self.profiler.begin(self.global_steps)
        self._start_batch()
        inputs, outputs, losses = {}, {}, []
        self.optimizer.begin_backward(False)
        for kind, chunk, mb in stage_schedule(self.stage_id, self.num_stages, m, self.virtual_stages):
            if kind == BACKWARD:
                self._backward(chunk, mb, inputs.pop((chunk, mb)), outputs.pop((chunk, mb)))
            else:
                inputs[chunk, mb], outputs[chunk, mb] = self._forward(chunk, mb, batches, losses, grad=True)
        start = perf_ns()
        self._wait_sends()
        self.timeline.record("send_wait", -1, start)
        start = perf_ns()
        self.module.allreduce_tied_weight_gradients()
        self.optimizer.begin_backward(True)  # now reduce: every micro-batch's gradient is in
        self.optimizer.after_backward()
        self.timeline.record("reduce", -1, start)
        self.agg_train_loss = self._aggregate(losses)
        self._loss_sum = self.agg_train_loss * m  # Engine._report divides by m
        step = self.global_steps
        self.micro_steps += m - 1  # Engine.step counts the last one and steps at the boundary
        self.step()
        if self.topology.tp_rank == 0:
            self.last_pipe_columns = self.timeline.emit(step, m)
        else:
            self.timeline.events = []
        return self.agg_train_loss

    def _report(self, outcome) -> None:
        self.timers.stop("train_batch")  # Engine.step reports right after the optimizer step
        super()._report(outcome)

    def eval_batch(self, data_iter, return_logits=False, compute_loss=True, reduce_output="avg", bcast_loss=True,
                   num_micro_batches=None):  # fmt: skip
        """The mean loss over ``num_micro_batches`` (default gradient_accumulation_steps) micro-batches,
        without gradients; with ``return_logits`` also the last stage's outputs (None elsewhere)."""
        if reduce_output != "avg":
            raise ValueError("eval_batch(reduce_output=...): only 'avg' (the mean over micro-batches) is supported")
        self.module.eval()
        batches = self._batches(data_iter)
        m = num_micro_batches or self.micro_batches
        self._start_batch()
        losses, logits = [], []
        forwards = [(c, mb) for kind, c, mb in stage_schedule(self.stage_id, self.num_stages, m, self.virtual_stages)
                    if kind == FORWARD]  # fmt: skip
        with torch.no_grad():
            for chunk, mb in forwards:
                self._forward(chunk, mb, batches, losses if compute_loss else None, grad=False,
                              logits=logits if return_logits else None)  # fmt: skip
            self._wait_sends()
            loss = self._aggregate(losses, mean_over=m, bcast=bcast_loss)
        self.timeline.events = []  # eval steps are not training steps: no pipe rows
        if return_logits:
            return loss, (logits if self.is_last_stage() else None)
        return loss

    def _batches(self, data_iter):
        if data_iter is not None:
            self.set_dataiterator(data_iter)
        if self.data_iterator is None and self.training_dataloader is not None:
            self.data_iterator = iter(self.training_dataloader)
        if self.data_iterator is None and (self.is_first_stage() or self.is_last_stage()):
            raise PipelineError("train_batch/eval_batch: no data_iter given and no training_data at initialize")
        return self.data_iterator

    # ---------------------------------------------------------------- one micro-batch

    def _start_batch(self) -> None:
        self._send_works: list = []
        self._meta_sent: set[int] = set()  # local chunks whose output shapes went out this batch
        self._received_like: dict[int, tuple[list[torch.Tensor], bool]] = {}  # per local chunk: buffers, as tuple

    def _forward(self, chunk: int, mb: int, batches, losses, *, grad: bool, logits: list | None = None):
        """One micro-batch forward through this stage's ``chunk``; the model's last chunk appends its
        loss to ``losses`` (and its outputs to ``logits``). Returns (the chunk's input, what backward
        starts from: the loss or the outputs)."""
        first, last = self._is_first_chunk(chunk), self._is_last_chunk(chunk)
        batch = next(batches) if first or last else None
        if first:
            x = _to(batch[0], self.device, detach=True)
        else:
            start = perf_ns()
            x = self._recv_activations(chunk, requires_grad=grad)
            self.timeline.record("recv_act", mb, start)
        start = perf_ns()
        out = self.module(x, chunk)
        if last and logits is not None:
            logits.append(out.detach())
        if last and losses is not None:
            loss = self.module.loss_fn(out, _to(batch[1], self.device, detach=False))
            losses.append(loss.detach())
            out = loss
        if grad:
            self.timeline.record("fwd", mb, start)
        if not last:
            self._send_activations(chunk, out)
        return x, out

    def _backward(self, chunk: int, mb: int, x, out) -> None:
        if self._is_last_chunk(chunk):
            grads, tensors = None, [out.float() / self.micro_batches * self.loss_scale]
        else:
            start = perf_ns()
            sent = [t for t in _tensors(out) if _carries_grad(t)]
            received = self._recv(self.next_rank, sent, "pipe.recv_grads", _GRADIENTS)
            self.timeline.record("recv_grad", mb, start)
            pairs = [(t, g) for t, g in zip(sent, received, strict=True) if t.requires_grad]
            tensors, grads = [t for t, _ in pairs], [g for _, g in pairs]
        start = perf_ns()
        if tensors:
            torch.autograd.backward(tensors, grad_tensors=grads)
        self.timeline.record("bwd", mb, start)
        if not self._is_first_chunk(chunk):
            inputs = [t for t in _tensors(x) if _carries_grad(t)]
            grads_in = [t.grad if t.grad is not None else torch.zeros_like(t) for t in inputs]
            self._send(grads_in, self.prev_rank, "pipe.send_grads", _GRADIENTS)

    # ---------------------------------------------------------------- point-to-point

    def _send(self, tensors, dst: int, log_name: str, tag: int) -> None:
        for t in tensors:
            t = t.detach().contiguous()
            self._send_works.append((comm.isend(t, dst, tag=tag, log_name=log_name), t))

    def _recv(self, src: int, like, log_name: str, tag: int) -> list[torch.Tensor]:
        out = []
        for t in like:
            buf = torch.empty(t.shape, dtype=t.dtype, device=self.device)
            comm.recv(buf, src, tag=tag, log_name=log_name)
            out.append(buf)
        return out

    def _send_activations(self, chunk: int, out) -> None:
        tensors = _tensors(out)
        if chunk not in self._meta_sent:  # shapes and dtypes once per batch and chunk: the receiver sizes its buffers
            meta = [len(tensors), int(isinstance(out, tuple))]
            for t in tensors:
                meta += [_DTYPES.index(t.dtype), t.dim(), *t.shape]
            if len(meta) > _META_LEN:
                raise PipelineError(f"stage {self.stage_id} sends too many / too high-rank tensors to describe")
            self._send([torch.tensor(meta + [0] * (_META_LEN - len(meta)), dtype=torch.int64)], self.next_rank,
                       "pipe.send_meta", _ACTIVATIONS)  # fmt: skip
            self._meta_sent.add(chunk)
        self._send(tensors, self.next_rank, "pipe.send_activations", _ACTIVATIONS)

    def _recv_activations(self, chunk: int, *, requires_grad: bool):
        if chunk not in self._received_like:  # the sender's meta comes first on the same stream
            meta = torch.empty(_META_LEN, dtype=torch.int64)
            comm.recv(meta, self.prev_rank, tag=_ACTIVATIONS, log_name="pipe.recv_meta")
            meta, like, pos = meta.tolist(), [], 2
            for _ in range(meta[0]):
                dtype, ndim = _DTYPES[meta[pos]], meta[pos + 1]
                like.append(torch.empty(meta[pos + 2 : pos + 2 + ndim], dtype=dtype))
                pos += 2 + ndim
            self._received_like[chunk] = like, bool(meta[1])
        like, as_tuple = self._received_like[chunk]
        got = self._recv(self.prev_rank, like, "pipe.recv_activations", _ACTIVATIONS)
        for t in got:
            t.requires_grad_(requires_grad and t.is_floating_point())
        return tuple(got) if as_tuple else got[0]

    def _wait_sends(self) -> None:
        for work, _ in self._send_works:
            work.wait()
        self._send_works = []

    # ---------------------------------------------------------------- loss

    def _aggregate(self, losses, mean_over: int | None = None, bcast: bool = True) -> torch.Tensor:
        """The last stage's mean micro-batch loss, averaged over data-parallel replicas and sent to
        every stage of this pipeline (DeepSpeed's _aggregate_total_loss)."""
        loss = torch.zeros((), dtype=torch.float32, device=self.device)
        if self.is_last_stage() and losses:
            loss = torch.stack([x.float() for x in losses]).sum() / (mean_over or self.micro_batches)
            if self.dp_world_size > 1:
                comm.all_reduce(loss, group=self.dp_group, log_name="pipe.loss_all_reduce")
                loss /= self.dp_world_size
        if self.num_stages > 1 and bcast:
            comm.broadcast(loss, src=self.last_rank, group=self.pipe_group, log_name="pipe.loss_broadcast")
        return loss


def _tensors(x) -> list[torch.Tensor]:
    if torch.is_tensor(x):
        return [x]
    if isinstance(x, (tuple, list)) and all(torch.is_tensor(t) for t in x):
        return list(x)
    raise PipelineError(f"stage boundaries carry a tensor or a tuple of tensors, got {type(x).__name__}")


def _carries_grad(t: torch.Tensor) -> bool:
    return t.is_floating_point()


def _to(x, device, *, detach: bool):
    if torch.is_tensor(x):
        x = x.to(device)
        return x.detach().clone() if detach else x
    if isinstance(x, (tuple, list)):
        return type(x)(_to(t, device, detach=detach) for t in x)
    return x
