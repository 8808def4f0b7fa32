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
