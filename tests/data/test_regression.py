import gzip

import numpy as np
import pytest
import torch

from kernel_attention.data.files import DataFormatError
from kernel_attention.data.uci import fit_scaler, load_airline, load_co2, load_parkinsons, load_uci

ROWS = np.array([[1.0, 2.0, 10.0], [2.0, 4.0, 20.0], [3.0, 1.0, 15.0], [4.0, 8.0, 40.0], [5.0, 0.5, 5.0]])


def _uci(root, folder="concrete", gz=False, n_splits=2):
    d = root / "uci-regression" / folder
    d.mkdir(parents=True)
    text = "\n".join(" ".join(f"{v:g}" for v in r) for r in ROWS) + "\n\n"  # trailing blank line as in concrete
    if gz:
        (d / "data.txt.gz").write_bytes(gzip.compress(text.encode()))
    else:
        (d / "data.txt").write_text(text)
    (d / "index_features.txt").write_text("0\n1\n")
    (d / "index_target.txt").write_text("2\n")
    (d / "n_splits.txt").write_text(f"{n_splits}\n")
    for k in range(n_splits):
        test = [k, k + 2]
        (d / f"index_train_{k}.txt").write_text("\n".join(str(i) for i in range(5) if i not in test) + "\n")
        (d / f"index_test_{k}.txt").write_text("\n".join(map(str, test)) + "\n")
    return d


@pytest.mark.parametrize("gz", [False, True])
def test_gal_ghahramani_layout(tmp_path, gz):
    _uci(tmp_path, gz=gz)
    data = load_uci(tmp_path, "concrete")
    assert torch.equal(data.x, torch.tensor(ROWS[:, :2]))
    assert torch.equal(data.y, torch.tensor(ROWS[:, 2:]))
    assert len(data.given_splits) == 2
    assert data.given_splits[1].test == [1, 3] and data.given_splits[1].train == [0, 2, 4]


def test_malformed_rows_name_file_and_line(tmp_path):
    d = _uci(tmp_path)
    (d / "data.txt").write_text("1 2 3\n4 5 6\n7 8\n")
    with pytest.raises(DataFormatError, match=r"data\.txt:3: expected 3 fields, got 2"):
        load_uci(tmp_path, "concrete")
    (d / "data.txt").write_text("1 2 3\n4 five 6\n")
    with pytest.raises(DataFormatError, match=r"data\.txt:2: not a number: 'five'"):
        load_uci(tmp_path, "concrete")
    _uci(tmp_path, folder="yacht")
    (tmp_path / "uci-regression" / "yacht" / "index_test_0.txt").write_text("0\n9\n")
    with pytest.raises(DataFormatError, match=r"index_test_0\.txt:2: index 9 outside 0\.\.4"):
        load_uci(tmp_path, "yacht")


def test_minmax_and_standard_scaling():
    v = torch.tensor(ROWS)
    s = fit_scaler(v, "minmax")
    z = s.transform(v)
    assert torch.allclose(z.min(0).values, torch.full((3,), -1.0, dtype=torch.float64))
    assert torch.allclose(z.max(0).values, torch.ones(3, dtype=torch.float64))
    ref = 2 * (ROWS - ROWS.min(0)) / (ROWS.max(0) - ROWS.min(0)) - 1  # the IKA code's formula
    assert np.allclose(z.numpy(), ref)
    assert torch.allclose(s.inverse(z), v)
    st = fit_scaler(v, "standard", indices=[0, 1, 2])
    zz = st.transform(v[:3])
    assert np.allclose(zz.numpy(), (ROWS[:3] - ROWS[:3].mean(0)) / ROWS[:3].std(0))
    const = fit_scaler(torch.ones(4, 1, dtype=torch.float64), "minmax").transform(torch.ones(4, 1, dtype=torch.float64))
    assert torch.isfinite(const).all()
    with pytest.raises(ValueError, match="accepted: minmax, standard, none"):
        fit_scaler(v, "robust")


def test_parkinsons_csv(tmp_path):
    d = tmp_path / "uci-regression" / "parkinsons-telemonitoring"
    d.mkdir(parents=True)
    d.joinpath("parkinsons_updrs.data").write_text(
        "subject#,age,sex,test_time,motor_UPDRS,total_UPDRS,Jitter(%)\n"
        "1,72,0,5.6,28.2,34.4,0.0066\n1,72,0,12.7,28.4,34.9,0.003\n2,58,1,7.1,20.1,25.0,0.005"
    )
    data = load_parkinsons(tmp_path)
    assert data.feature_names == ["age", "sex", "test_time", "Jitter(%)"]
    assert data.y[:, 0].tolist() == [34.4, 34.9, 25.0]
    with_motor = load_parkinsons(tmp_path, drop_other_score=False)
    assert "motor_UPDRS" in with_motor.feature_names and with_motor.x.shape == (3, 5)
    with_subject = load_parkinsons(tmp_path, subject=True)
    assert with_subject.feature_names == ["subject#", "age", "sex", "test_time", "Jitter(%)"]
    assert with_subject.x[:, 0].tolist() == [1.0, 1.0, 2.0]
    # the registry's options reach the loader (what a config's data.dataset mapping sets)
    from kernel_attention.data import DATASETS
    both = DATASETS.create({"name": "parkinsons", "other_score": True, "subject": True, "root": str(tmp_path)})
    assert both.feature_names == ["subject#", "age", "sex", "test_time", "motor_UPDRS", "Jitter(%)"]
    d.joinpath("parkinsons_updrs.data").write_text("subject#,age,motor_UPDRS,total_UPDRS\n1,72,2,3\n1,x,2,3\n")
    with pytest.raises(DataFormatError, match=r"parkinsons_updrs\.data:3"):
        load_parkinsons(tmp_path)


def test_co2_and_airline(tmp_path):
    c = tmp_path / "timeseries" / "mauna-loa-co2"
    c.mkdir(parents=True)
    c.joinpath("co2_mm_mlo.txt").write_text(
        "# header comment\n#\n"
        "  1958   3   1958.2027     315.70     314.43     -1   -9.99   -0.99\n"
        "  1958   4   1958.2877     317.45     315.16     -1   -9.99   -0.99\n"
        "  2005   1   2005.0411     378.40     378.00     30    0.50    0.20\n"
    )
    co2 = load_co2(tmp_path)
    assert co2.x[:, 0].tolist() == [1958.2027, 1958.2877, 2005.0411]
    assert co2.y[:, 0].tolist() == [315.70, 317.45, 378.40]
    assert len(load_co2(tmp_path, end_year=2004)) == 2
    a = tmp_path / "timeseries" / "airline-passengers"
    a.mkdir(parents=True)
    a.joinpath("AirPassengers.csv").write_bytes(b'"date","value"\r\n1949-01-01,112\r\n1949-02-01,118\r\n1949-03-01,132\r\n')
    air = load_airline(tmp_path)
    assert air.x[:, 0].tolist() == [0, 1, 2] and air.y[:, 0].tolist() == [112, 118, 132]
    a.joinpath("AirPassengers.csv").write_bytes(b'"date","value"\n1949-01-01,112\n1949-02-01;118\n')
    with pytest.raises(DataFormatError, match=r"AirPassengers\.csv:3"):
        load_airline(tmp_path)


def test_ika_random_splits(tmp_path):
    _uci(tmp_path)
    data = load_uci(tmp_path, "concrete")
    splits = data.random_splits(n_splits=10, train_fraction=0.6, seed=5)
    assert len(splits) == 10 and len({tuple(s.test) for s in splits}) > 1
    for s in splits:
        assert len(s.train) == int(5 * 0.6) and sorted(s.train + s.test) == list(range(5))


@pytest.mark.parametrize("bad", ["nan", "inf", "-Infinity", "NaN"])
def test_nan_and_inf_fields_are_rejected_naming_file_and_line(tmp_path, bad):
    d = _uci(tmp_path)
    (d / "data.txt").write_text(f"1 2 3\n4 {bad} 6\n")
    with pytest.raises(DataFormatError, match=rf"data.txt:2: not a finite number: '{bad}' \(column 2\)"):
        load_uci(tmp_path, "concrete")
    air = tmp_path / "timeseries" / "airline-passengers"
    air.mkdir(parents=True)
    (air / "AirPassengers.csv").write_text(f'"Month","Passengers"\n"1949-01",112\n"1949-02",{bad}\n')
    with pytest.raises(DataFormatError, match="AirPassengers.csv:3: expected 'YYYY-MM-DD,value' with a finite value"):
        load_airline(tmp_path)


@pytest.mark.parametrize("n", [-3, 0])
def test_a_number_of_splits_below_one_is_rejected(tmp_path, n):
    from kernel_attention.data.protocols import random_splits

    d = _uci(tmp_path)
    (d / "n_splits.txt").write_text(f"{n}\n")
    with pytest.raises(DataFormatError, match=f"n_splits.txt:1: the number of splits must be >= 1, got {n}"):
        load_uci(tmp_path, "concrete")
    with pytest.raises(ValueError, match=f"n_splits must be an integer >= 1, got {n}"):
        random_splits(10, n_splits=n)
