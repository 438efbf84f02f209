"""`rankscope import` of damaged DeepSpeed outputs, in process: a corrupt file is named and the rest kept,
an unknown file is an error.

Split by tier: what needs processes, sockets or seconds is in tests/integration/tools/test_import_deepspeed.py."""

from __future__ import annotations

from tests._import_util import copy_fixture, only_run, query, rankscope


def test_corrupt_files_are_named_and_the_rest_kept(tmp_path, capsys):
    src = copy_fixture(tmp_path / "ds")
    good_csv = next(src.rglob("Train_Samples_lr.csv"))
    bad_csv = good_csv.with_name("Train_Samples_loss.csv")
    bad_csv.write_text("step,loss\n8,0.5\n16,not-a-number\n24,0.25\n")
    events = next(src.rglob("events.out.tfevents*"))
    full = events.read_bytes()
    events.write_bytes(full[: len(full) // 2])
    (src / "table.parquet").write_bytes(b"PAR1" + b"\0" * 100)  # truncated Parquet
    data = tmp_path / "data"
    # imports what it can, and says by its exit status that something was skipped
    assert rankscope("import", src, "--data-dir", data) == 1
    err = capsys.readouterr().err
    assert f"{bad_csv}:line 3: not a number" in err
    assert f"{events}:record" in err and "cut short" in err
    assert f"{src / 'table.parquet'}: unreadable Parquet" in err
    run_id = only_run(data)
    (loss,) = query(
        data,
        "SELECT list(value ORDER BY samples) FROM monitor WHERE run_id = ? AND tag = ?",
        [run_id, "Train/Samples/loss"],
    )
    assert loss[0] == [0.5, 0.25]
    # the half event file's records are kept; the csv files fill in the rest of each series
    tags = dict(query(data, "SELECT tag, count(*) FROM monitor WHERE run_id = ? GROUP BY tag", [run_id]))
    assert all(n == 6 for tag, n in tags.items() if tag != "Train/Samples/loss")
    assert query(data, "SELECT count(*) FROM comm WHERE run_id = ?", [run_id])[0][0] == 47


def test_unknown_file_is_an_error(tmp_path, capsys):
    odd = tmp_path / "notes.txt"
    odd.write_text("hello\n")
    assert rankscope("import", odd, "--data-dir", tmp_path / "data") == 1
    assert f"{odd}: not a DeepSpeed output" in capsys.readouterr().err
