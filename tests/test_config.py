import pytest
import yaml

from kernel_attention.config import ConfigError, apply_overrides, dump_config, load_config, parse_override


def test_override_values_are_typed():
    assert parse_override("train.lr=1e-3") == (["train", "lr"], 1e-3)
    assert parse_override("train.max_steps=100") == (["train", "max_steps"], 100)
    assert parse_override("train.progress=false") == (["train", "progress"], False)
    assert parse_override("train.betas=[0.9, 0.98]") == (["train", "betas"], [0.9, 0.98])
    assert parse_override("model.attention.kernel=poly:degree=3") == (["model", "attention", "kernel"],
                                                                    "poly:degree=3")
    assert parse_override("eval.beam=") == (["eval", "beam"], None)
    assert parse_override("model.x={a: 1}") == (["model", "x"], {"a": 1})


def test_load_file_apply_overrides_and_dump(tmp_path):
    (tmp_path / "c.yaml").write_text("seed: 1\ntrain:\n  lr: 5e-4\n  max_steps: 10\nmodel:\n  d_model: 64\n")
    cfg = load_config(tmp_path / "c.yaml", ["train.lr=1e-3", "model.attention.kernel=rbf", "seed=2"])
    assert cfg == {"seed": 2, "train": {"lr": 1e-3, "max_steps": 10},
                   "model": {"d_model": 64, "attention": {"kernel": "rbf"}}}
    assert isinstance(load_config(tmp_path / "c.yaml")["train"]["lr"], float)  # YAML 1.1 would say str
    out = dump_config(cfg, tmp_path / "run")
    assert out == tmp_path / "run" / "config.yaml"
    assert yaml.safe_load(out.read_text()) == cfg


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="unknown config section 'trian'; accepted: run, seed, task"):
        load_config({"trian": {"lr": 1}})
    with pytest.raises(ConfigError, match="unknown config section 'optim'"):
        load_config({}, ["optim.lr=1"])
    with pytest.raises(ConfigError, match="write section.key=value"):
        parse_override("train.lr")
    with pytest.raises(ConfigError, match="write section.key=value"):
        parse_override("train..lr=1")
    with pytest.raises(ConfigError, match="train.lr is 0.1, not a mapping"):
        apply_overrides({"train": {"lr": 0.1}}, ["train.lr.x=1"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping of sections"):
        load_config(tmp_path / "list.yaml")
    assert load_config({"custom": 1}, accepted=["custom"]) == {"custom": 1}


def test_a_self_referencing_yaml_is_a_config_error_not_a_recursion_error(tmp_path):
    (tmp_path / "loop.yaml").write_text("task: &t\n  name: synthetic\n  again: *t\n")
    with pytest.raises(ConfigError, match="loop.yaml: it refers to itself: a YAML alias"):
        load_config(tmp_path / "loop.yaml")
    with pytest.raises(ConfigError, match="override value .*refers to itself"):
        load_config({}, ["model.x=&a [*a]"])
