"""Whole or absent: a write that fails part-way leaves the old file, and no temporary file behind."""

import json

import pytest

from kernel_attention.atomic_write import replacing, write_text


def test_write_text_replaces_the_file(tmp_path):
    p = tmp_path / "result.json"
    write_text(p, json.dumps({"a": 1}))
    write_text(p, json.dumps({"a": 2}))
    assert json.loads(p.read_text()) == {"a": 2} and [x.name for x in tmp_path.iterdir()] == ["result.json"]


def test_a_write_that_fails_part_way_leaves_the_old_file(tmp_path):
    p = tmp_path / "last.pt"
    p.write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with replacing(p) as tmp:
            tmp.write_text("half of the ne")
            raise KeyboardInterrupt  # a Ctrl-C in the middle of torch.save, say
    assert p.read_text() == "old" and [x.name for x in tmp_path.iterdir()] == ["last.pt"]


def test_the_temporary_file_of_a_killed_writer_is_removed_and_a_living_ones_kept(tmp_path):
    import os
    import subprocess
    import sys

    from kernel_attention.atomic_write import remove_orphans

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"last.pt.{int(gone.stdout)}.tmp"
    living = tmp_path / f"last.pt.{os.getpid()}.tmp"
    for p in (dead, living, tmp_path / "last.pt"):
        p.write_text("x")
    assert remove_orphans(tmp_path) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["last.pt", living.name])
