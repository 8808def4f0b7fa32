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


def test_ignored_columns_need_not_hold_numbers(tmp_path):
    """ignore=id+date leaves out a column of dates, as the error about it advises."""
    (tmp_path / "d.csv").write_text("id,date,a,y\n" + "".join(f"{i},2020-01-0{i},{i / 10},{i / 5}\n"
                                                              for i in range(1, 8)))
    with pytest.raises(DataFormatError, match=r"column 'date' holds '2020-01-01'.*ignore=id\+date\)"):
        DATASETS.create(f"csv:path={tmp_path / 'd.csv'},target=y,ignore=id")
    d = DATASETS.create(f"csv:path={tmp_path / 'd.csv'},target=y,ignore=id+date")
    assert d.feature_names == ["a"] and d.x[:, 0].tolist() == [i / 10 for i in range(1, 8)]
    assert d.y[:, 0].tolist() == [i / 5 for i in range(1, 8)]


def test_csv_target_by_name_or_index(tmp_path):
    d = DATASETS.create(f"csv:path={write_table(tmp_path / 't.csv')},target=y,ignore=id")
    assert d.x.shape == (30, 2) and d.y.shape == (30, 1) and d.feature_names == ["a", "b"] and d.target_name == "y"
    d2 = DATASETS.create(f"csv:path={write_table(tmp_path / 'n.csv', header=False)},target=3,ignore=0")
    assert d2.x.tolist() == d.x.tolist() and d2.y.tolist() == d.y.tolist()
    (tmp_path / "w.csv").write_text("a,y\n1,2\nx,3\n4,5\n")
    with pytest.raises(DataFormatError, match="not a finite number"):
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
    table.rename(tmp_path / "gone.csv")                   # the model is sized from the table's columns
    assert main(["evaluate", str(run)]) == 2
    err = capsys.readouterr().err
    assert "is sized from its data (a regression run keeps no vocabulary files" in err and "written before" not in err
    from kernel_attention.tasks import build_task
    with pytest.raises(SpecError, match=r"classification dataset.*csv:path=\.\.\.,target=\.\.\."):
        build_task({**cfg, "data": {"dataset": f"csv:path={table}"}})      # no target: labelled text


def test_negative_columns_count_from_the_end_and_out_of_range_ones_are_named(tmp_path):
    t = write_table(tmp_path / "t.csv", header=False)
    d = DATASETS.create(f"csv:path={t},target=3,ignore=0")
    d2 = DATASETS.create(f"csv:path={t},target=-1,ignore=-4")
    assert d2.x.tolist() == d.x.tolist() and d2.y.tolist() == d.y.tolist() and d2.x.shape == (30, 2)
    for spec in ("target=-5", "target=4", "target=3,ignore=-5"):
        with pytest.raises(DataFormatError, match=r"is not a column: the first row has 4 \(0\.\.3, or -1 for the "):
            DATASETS.create(f"csv:path={t},{spec}")


@pytest.mark.parametrize("bad, column, fix", [("nan", "y", "every row needs a target"),
                                              ("inf", "a", r"leave such columns out with ignore=id\+a"),
                                              ("-inf", "y", "every row needs a target")])
def test_nan_and_inf_cells_are_named_with_their_line(tmp_path, bad, column, fix):
    t = write_table(tmp_path / "t.csv")
    lines = t.read_text().splitlines()
    cells = lines[4].split(",")
    cells[["id", "a", "b", "y"].index(column)] = bad
    lines[4] = ",".join(cells)
    t.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match=rf"t\.csv:5: column '{column}' holds '{bad}', not a finite number "
                                              rf"\({fix}"):
        DATASETS.create(f"csv:path={t},target=y,ignore=id")
