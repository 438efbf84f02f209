"""`python -m native.nvme_tune`: sweeps, prints the DeepSpeed aio block, rejects bad dirs."""

import json
import os

from native import nvme_tune


def test_tune_prints_best_rates_and_aio_block(tmp_path, capsys):
    rc = nvme_tune.main(["--dir", str(tmp_path), "--io-size", str(1 << 20), "--loops", "1", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "Best performance (GB/sec): read = " in out
    block = json.loads(out[out.index("{") :])
    assert set(block["aio"]) == {"single_submit", "overlap_events", "intra_op_parallelism", "queue_depth", "block_size"}
    assert block["aio"]["block_size"] in nvme_tune.DEFAULT_GRID["block_size"]
    assert block["aio"]["single_submit"] in ("true", "false")
    assert os.listdir(tmp_path) == []  # the test files are removed


def test_sweep_measures_every_setting(tmp_path):
    grid = {
        "block_size": [4096, 65536],
        "queue_depth": [2],
        "single_submit": [True],
        "overlap_events": [False, True],
        "intra_op_parallelism": [1],
    }
    trials = nvme_tune.sweep(str(tmp_path), io_size=300_000, loops=1, grid=grid, progress=False)
    assert len(trials) == 4
    assert all(t.read_gbs > 0 and t.write_gbs > 0 for t in trials)
    assert {(t.settings["block_size"], t.settings["overlap_events"]) for t in trials} == {
        (4096, False),
        (4096, True),
        (65536, False),
        (65536, True),
    }


def test_bad_directory_is_a_clear_error(tmp_path, capsys):
    missing = tmp_path / "missing"
    assert nvme_tune.main(["--dir", str(missing)]) == 2
    assert f"--dir {missing}: no such directory" in capsys.readouterr().err
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert nvme_tune.main(["--dir", str(a_file)]) == 2
    assert "not a directory" in capsys.readouterr().err
