"""MonitorMaster: DeepSpeed's csv_monitor / tensorboard file layouts, written off
the training thread, flushed on close() and at interpreter exit.

Split by tier: what needs processes, sockets or seconds is in tests/integration/trainer/test_monitor.py."""

import os
import threading
import time

import pytest
import torch

from trainer.monitor import MonitorMaster


@pytest.fixture(autouse=True)
def _rank0(monkeypatch):
    monkeypatch.setenv("RANK", "0")


def _csv_cfg(tmp_path, job="train_bert"):
    return {"csv_monitor": {"enabled": True, "output_path": str(tmp_path / "ds_logs") + "/", "job_name": job}}


def test_csv_layout_header_and_rows_are_deepspeeds(tmp_path):
    mon = MonitorMaster(_csv_cfg(tmp_path))
    assert mon.enabled
    mon.write_events([("Train/Samples/train_loss", 0.5, 8), ("Train/Samples/lr", 0.001, 8)])
    mon.write_events([("Train/Samples/train_loss", torch.tensor(0.25), 16), ("my metric", 3, 16)])
    mon.close()

    job_dir = tmp_path / "ds_logs" / "train_bert"
    assert sorted(os.listdir(job_dir)) == ["Train_Samples_lr.csv", "Train_Samples_train_loss.csv", "my_metric.csv"]
    # csv.writer rows end in \r\n; header is "step" and the tag's last '/'-part.
    assert (job_dir / "Train_Samples_train_loss.csv").read_bytes() == b"step,train_loss\r\n8,0.5\r\n16,0.25\r\n"
    assert (job_dir / "Train_Samples_lr.csv").read_bytes() == b"step,lr\r\n8,0.001\r\n"
    assert (job_dir / "my_metric.csv").read_bytes() == b"step,my metric\r\n16,3\r\n"


def test_csv_header_is_per_process_like_deepspeed(tmp_path):
    # DeepSpeed appends and writes the header on each process's first write of a file.
    for samples in (1, 2):
        mon = MonitorMaster(_csv_cfg(tmp_path, job="j"))
        mon.write_events([("Train/loss", 1.0, samples)])
        mon.close()
    assert (
        tmp_path / "ds_logs" / "j" / "Train_loss.csv"
    ).read_bytes() == b"step,loss\r\n1,1.0\r\nstep,loss\r\n2,1.0\r\n"


def test_tensorboard_events_read_back_with_event_accumulator(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = {"tensorboard": {"enabled": True, "output_path": str(tmp_path / "tb"), "job_name": "run1"}}
    mon = MonitorMaster(cfg)
    want = {"Train/Samples/train_loss": [(32, 2.5), (64, 1.25)], "Train/Samples/lr": [(32, 1e-3), (64, 5e-4)]}
    for i in range(2):
        mon.write_events([(tag, points[i][1], points[i][0]) for tag, points in want.items()])
    mon.close()

    log_dir = tmp_path / "tb" / "run1"
    assert any(name.startswith("events.out.tfevents.") for name in os.listdir(log_dir))
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == sorted(want)
    for tag, points in want.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in points]
        assert [v for _, v in got] == pytest.approx([v for _, v in points], rel=1e-6)  # stored as float32


GATE_S = 10.0  # how long reading the slow value waits at most


class _SlowDeviceTensor(torch.Tensor):
    """A scalar whose value is only ready once ``gate`` opens, like a device tensor
    whose kernel is still running: reading it (.item()) waits."""

    gate = threading.Event()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.item:
            cls.gate.wait(GATE_S)
        return super().__torch_function__(func, types, args, kwargs or {})


def test_write_events_does_not_wait_for_values_or_files(tmp_path):
    mon = MonitorMaster(_csv_cfg(tmp_path, job="slow"))
    slow = torch.tensor(7.0).as_subclass(_SlowDeviceTensor)
    start = time.monotonic()
    mon.write_events([("Train/loss", slow, 1)])
    mon.write_events([("Train/loss", 8.0, 2)])
    elapsed = time.monotonic() - start
    path = tmp_path / "ds_logs" / "slow" / "Train_loss.csv"
    # Waiting for the value would take the gate's GATE_S (nobody opens it before the assert); half
    # of it tells "did not wait" from "waited" on any host, however loaded (no absolute timing).
    assert elapsed < GATE_S / 2, elapsed
    assert not path.exists()  # the writer is still waiting on the first value
    _SlowDeviceTensor.gate.set()
    mon.flush()
    assert path.read_bytes() == b"step,loss\r\n1,7.0\r\n2,8.0\r\n"
    mon.close()


def test_defaults_write_under_the_working_directory(tmp_path, monkeypatch):
    # output_path "" and job_name "DeepSpeedJobName" are DeepSpeed's defaults
    monkeypatch.chdir(tmp_path)
    mon = MonitorMaster({"csv_monitor": {"enabled": True}})
    mon.write_events([("loss", 2.0, 4)])
    mon.close()
    assert (tmp_path / "DeepSpeedJobName" / "loss.csv").read_bytes() == b"step,loss\r\n4,2.0\r\n"


def test_other_ranks_write_no_files(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    mon = MonitorMaster({**_csv_cfg(tmp_path), "tensorboard": {"enabled": True, "output_path": str(tmp_path / "tb")}})
    mon.write_events([("Train/loss", 1.0, 1)])
    mon.close()
    assert not (tmp_path / "ds_logs").exists() and not (tmp_path / "tb").exists()


def test_disabled_config_is_not_enabled(tmp_path):
    mon = MonitorMaster({"train_batch_size": 8, "csv_monitor": {"enabled": False}})
    assert not mon.enabled
    mon.write_events([("Train/loss", 1.0, 1)])  # a no-op, not an error
    mon.close()


@pytest.mark.parametrize("section", ["csv_monitor", "tensorboard"])
def test_output_path_that_is_a_file_is_rejected_naming_the_key(tmp_path, section):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    with pytest.raises(ValueError, match=rf"{section}\.output_path: .*not_a_dir"):
        MonitorMaster({section: {"enabled": True, "output_path": str(blocker), "job_name": "j"}})


@pytest.mark.parametrize(
    "block, key",
    [
        ({"enabled": "yes"}, "csv_monitor.enabled"),
        ({"enabled": True, "job_name": ""}, "csv_monitor.job_name"),
        ({"enabled": True, "output_path": 3}, "csv_monitor.output_path"),
    ],
)
def test_bad_config_values_name_the_key(block, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        MonitorMaster({"csv_monitor": block})


def test_malformed_events_are_rejected_clearly(tmp_path):
    mon = MonitorMaster(_csv_cfg(tmp_path))
    with pytest.raises(TypeError, match="tag, value, samples"):
        mon.write_events([("Train/loss", 1.0)])
    with pytest.raises(TypeError, match="'Train/loss': value must be a number"):
        mon.write_events([("Train/loss", "high", 1)])
    with pytest.raises(TypeError, match="samples must be an integer"):
        mon.write_events([("Train/loss", 1.0, 1.5)])
    mon.close()
