"""Your own numeric table by path for regression: ``csv:path=FILE,target=NAME|INDEX``."""

import json

import pytest
import yaml

from kernel_attention.cli import main
from kernel_attention.data import DATASETS, DataFormatError
from kernel_attention.registry import SpecError


def write_table(path, n=30, header=True):
    rows = [f"{i},{i / n:.4f},{(i * 7 % n) / n:.4f},{2 * i / n - (i * 7 % n) / n:.4f}" for i in range(n)]
    path.write_text(("id,a,b,y\n" if header else "") + "\n".join(rows) + "\n")
    return path


def test_csv_target_by_name_or_index(tmp_path):
    d = DATASETS.create(f"csv:path={write_table(tmp_path / 't.csv')},target=y,ignore=id")
    assert d.x.shape == (30, 2) and d.y.shape == (30, 1) and d.feature_names == ["a", "b"] and d.target_name == "y"
    d2 = DATASETS.create(f"csv:path={write_table(tmp_path / 'n.csv', header=False)},target=3,ignore=0")
    assert d2.x.tolist() == d.x.tolist() and d2.y.tolist() == d.y.tolist()
    (tmp_path / "w.csv").write_text("a,y\n1,2\nx,3\n4,5\n")
    with pytest.raises(DataFormatError, match="not a number"):
        DATASETS.create(f"csv:path={tmp_path / 'w.csv'},target=y")
    with pytest.raises(DataFormatError, match="no column 'z'"):
        DATASETS.create(f"csv:path={tmp_path / 't.csv'},target=z")
    with pytest.raises(SpecError, match="ignore= goes with target="):
        DATASETS.create(f"csv:path={tmp_path / 't.csv'},ignore=id")


def test_regression_on_a_csv_trains(tmp_path, capsys):
    table = write_table(tmp_path / "t.csv")
    cfg = {"task": {"name": "regression", "n_splits": 2, "train_fraction": 0.8},
           "data": {"dataset": f"csv:path={table},target=y,ignore=id"},
           "model": {"d_model": 8, "n_heads": 2},
           "train": {"max_steps": 5, "lr": 0.01, "progress": False, "test_best": False}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(cfg))
    run = tmp_path / "run"
    assert main(["train", str(tmp_path / "r.yaml"), "--run-dir", str(run)]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(run)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rmse"] >= 0
    from kernel_attention.tasks import build_task
    with pytest.raises(SpecError, match=r"classification dataset.*csv:path=\.\.\.,target=\.\.\."):
        build_task({**cfg, "data": {"dataset": f"csv:path={table}"}})      # no target: labelled text
