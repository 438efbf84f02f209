"""Where the JIT extensions are built (native/build.py): one folder per source file and version, so
two checkouts on one machine each keep their build. ninja's build file names the source by its path:
clones sharing a folder rebuilt it in turn, each time the other had loaded it."""

from __future__ import annotations

import shutil

from native import build


def test_two_checkouts_of_the_same_source_build_in_their_own_folders(tmp_path, monkeypatch):
    here = build.extension_dir("cpu_adam")
    clone = tmp_path / "clone" / "csrc"
    shutil.copytree(build.CSRC, clone)
    monkeypatch.setattr(build, "CSRC", clone)
    there = build.extension_dir("cpu_adam")
    assert there != here and there.parent == here.parent
    assert build.extension_dir("cpu_adam") == there  # the same checkout keeps its folder


def test_a_changed_source_builds_in_a_new_folder(tmp_path, monkeypatch):
    clone = tmp_path / "csrc"
    shutil.copytree(build.CSRC, clone)
    monkeypatch.setattr(build, "CSRC", clone)
    before = build.extension_dir("aio")
    (clone / "aio.cpp").write_text((clone / "aio.cpp").read_text() + "\n// changed\n")
    assert build.extension_dir("aio") != before
