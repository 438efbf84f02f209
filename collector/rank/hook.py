"""Instrument an existing script: ``attach()`` (or ``with attached():``) at the top.

What gets recorded while attached:

* every ``torch.distributed.<collective>`` looked up through the module at call
  time (``dist.all_reduce(...)``): plain scripts, DeepSpeed's ``deepspeed.comm``
  (its torch backend calls ``torch.distributed.*``) and FSDP's collectives. A
  function imported by name *before* attach (``from torch.distributed import
  all_reduce``) keeps the original and is not seen.
* DDP: its C++ reducer all-reduces gradient buckets without going through
  Python, so each DDP model gets ``ddp_comm_hook`` (torch's default all-reduce
  hook, recorded) at its first forward. A model whose owner registers a comm
  hook of their own keeps theirs (DDP allows one hook) and its buckets are only
  seen if that hook uses ``torch.distributed``.

attach works before or after ``init_process_group``: it wraps
``init_process_group`` so the run identity is agreed as soon as the process
group exists (collector.rank.session). ``detach`` restores every patched name,
flushes and sends RunEnd.

Steps: counted from the optimizer, from DeepSpeed's engine, or set with ``step(n)``
(collector.rank.steps says which wins). ``log({...})`` records the script's own metrics.
With DeepSpeed, its monitor events and fp16 loss-scale decisions are captured too
(collector.rank.deepspeed).

``collector.hook`` is the documented entry; it re-exports this module.
"""

import contextlib
import functools
import logging

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.nn.parallel import DistributedDataParallel

from collector.rank import deepspeed, metrics, ops, session, steps
from collector.rank import signals as _signals  # noqa: F401  (GC pauses and host samples follow the session)
from collector.rank.recorder import INSTRUMENTED_OPS

logger = logging.getLogger(__name__)

_originals: dict[tuple[object, str], object] = {}


def _patch(owner, name: str, value) -> None:
    _originals.setdefault((owner, name), getattr(owner, name))
    setattr(owner, name, value)


def ddp_comm_hook(process_group, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook equivalent to torch's default all-reduce (average over the
    group), issued through collector.rank.ops so each bucket becomes a comm record.
    Register it yourself with ``model.register_comm_hook(None, ddp_comm_hook)``
    when not using attach(). (The annotations are real objects, not strings:
    DDP checks them, so this module has no ``from __future__ import annotations``.)"""
    group = process_group if process_group is not None else c10d.GroupMember.WORLD
    tensor = bucket.buffer()
    tensor.div_(group.size())
    work = ops.all_reduce(tensor, group=group, async_op=True, log_name="ddp_bucket_all_reduce")
    return work.get_future().then(lambda fut: fut.value()[0])


def _ddp_forward(forward):
    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        if not getattr(self, "_rankscope_hook_checked", False):
            self._rankscope_hook_checked = True
            if not getattr(self, "_rankscope_user_hook", False):
                try:
                    _ORIGINAL_REGISTER(self, self.process_group, ddp_comm_hook)
                except Exception as exc:  # e.g. a hook registered through a path we do not see: leave DDP as is
                    logger.warning(
                        "rankscope: DDP's bucket all_reduces go unrecorded; registering the comm hook failed: %s", exc
                    )
        return forward(self, *args, **kwargs)

    return wrapper


_ORIGINAL_REGISTER = DistributedDataParallel.register_comm_hook


def _ddp_register_comm_hook(register):
    @functools.wraps(register)
    def wrapper(self, *args, **kwargs):
        self._rankscope_user_hook = True
        return register(self, *args, **kwargs)

    return wrapper


def attach(
    run: str | None = None,
    endpoint: str | None = None,
    token: str | None = None,
    config=None,
    tls_ca: str | None = None,
    hang_after_s: float | None = None,
):
    """Patch torch.distributed and start the telemetry session (idempotent).
    Returns the session (None if the config disables telemetry). ``hang_after_s``: a
    collective in flight this long is reported as a hang, with this rank's stacks
    (default ``RANKSCOPE_HANG_AFTER_S``, else ``telemetry.hang_after_s``, else 60 s)."""
    if not _originals:
        for op in INSTRUMENTED_OPS:
            _patch(dist, op, getattr(ops, op))
        _patch(dist, "init_process_group", ops.init_process_group)
        _patch(dist, "destroy_process_group", ops.destroy_process_group)
        _patch(DistributedDataParallel, "forward", _ddp_forward(DistributedDataParallel.forward))
        _patch(
            DistributedDataParallel,
            "register_comm_hook",
            _ddp_register_comm_hook(DistributedDataParallel.register_comm_hook),
        )
        for name in ("_register_builtin_comm_hook", "_register_fused_optim"):
            if hasattr(DistributedDataParallel, name):
                _patch(DistributedDataParallel, name, _ddp_register_comm_hook(getattr(DistributedDataParallel, name)))
    steps.install()
    deepspeed.install()
    return session.start(
        run=run, endpoint=endpoint, token=token, config=config, source="hook", tls_ca=tls_ca, hang_after_s=hang_after_s
    )


def detach(status: str = "finished") -> None:
    """Flush and end the session, then restore everything attach patched."""
    session.stop(status)
    steps.uninstall()
    deepspeed.uninstall()
    for (owner, name), original in _originals.items():
        setattr(owner, name, original)
    _originals.clear()


def log(data: dict, step: int | None = None) -> None:
    """Log the script's own metrics (name -> number) into the ``monitor`` table: ``hook.log({"loss": 1.9})``.
    Without ``step`` they belong to the step that ended last (collector.rank.metrics)."""
    metrics.log_metrics(data, step)


def step(n: int) -> None:
    """Set the step by hand: records from now on carry step ``n``; the optimizer no longer counts
    steps for this session (collector.rank.steps)."""
    steps.set_step(n)


def is_attached() -> bool:
    return bool(_originals)


@contextlib.contextmanager
def attached(*args, **kwargs):
    """``attach`` (the same arguments) for the ``with`` block, then ``detach`` with the block's
    status: finished, stopped on Ctrl-C, or failed on an exception or a non-zero ``sys.exit``."""
    active = attach(*args, **kwargs)
    try:
        yield active
    except SystemExit as e:  # sys.exit(0) in a script is a normal end
        detach("finished" if e.code in (None, 0) else "failed")
        raise
    except KeyboardInterrupt:  # its user stopped it
        detach("stopped")
        raise
    except BaseException:
        detach("failed")
        raise
    detach()


def main(argv: list[str] | None = None) -> int:
    """``python -m collector.hook [--run-name NAME] [--endpoint E] [--token T] script.py [args...]``:
    run an unmodified script attached (works under torchrun: ``torchrun ... -m collector.hook train.py``).

    The run's name is ``--run-name``: torchrun reads every option on its command line, the
    script's too, and refuses ``--run`` as an abbreviation of its own ``--run-path``.
    ``--run`` still works without torchrun (``python -m collector.hook --run NAME ...``), and
    ``RANKSCOPE_RUN`` works everywhere."""
    import argparse
    import runpy
    import sys

    parser = argparse.ArgumentParser(prog="python -m collector.hook", description=main.__doc__.split("\n")[0])
    parser.add_argument(
        "--run-name",
        "--run",  # kept for `python -m collector.hook --run NAME`; torchrun refuses it (its --run-path)
        dest="run",
        metavar="NAME",
        help="run name (default: RANKSCOPE_RUN, else the script's name); under torchrun use --run-name",
    )
    parser.add_argument("--endpoint", help="collector host:port (default: RANKSCOPE_ENDPOINT or 127.0.0.1:50051)")
    parser.add_argument("--token", help="bearer token (default: RANKSCOPE_TOKEN)")
    parser.add_argument(
        "--tls-ca", help="CA file to verify the collector's TLS certificate (default: RANKSCOPE_TLS_CA)"
    )
    parser.add_argument("script", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    opts = parser.parse_args(argv)
    sys.argv = [opts.script, *opts.args]
    with attached(run=opts.run, endpoint=opts.endpoint, token=opts.token, tls_ca=opts.tls_ca):
        runpy.run_path(opts.script, run_name="__main__")
    return 0
