import argparse
import gzip
import hashlib
import io
import urllib.error
import zipfile

import pytest

from kernel_attention.cli import data as cli_data
from kernel_attention.data import datasets
from kernel_attention.data.datasets import DATASETS, SPECS, check_dataset, ensure_files
from kernel_attention.data.download import DownloadError, download_file
from kernel_attention.registry import SpecError

ISSUE_NAMES = ["wikitext-2", "multi30k", "iwslt14", "mr", "cr", "subj", "mpqa", "trec", "sst2", "sst1", "cora",
               "citeseer", "pubmed", "boston", "housing", "concrete", "energy", "yacht", "wine-red", "kin8nm", "naval",
               "power", "protein", "parkinsons", "co2", "airline"]

CO2 = b"# comment\n  1958   3   1958.2027     315.70     314.43     -1   -9.99   -0.99\n  1958   4   1958.2877     317.45     315.16     -1   -9.99   -0.99\n"
CO2_PATH = "timeseries/mauna-loa-co2/co2_mm_mlo.txt"


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_every_dataset_of_the_issue_is_registered():
    for name in ISSUE_NAMES:
        assert name in DATASETS, name
        spec = SPECS[name]
        assert spec.files and all(not f.path.startswith("/") for f in spec.files)
    assert SPECS["housing"] is SPECS["boston"]
    with pytest.raises(SpecError, match="accepted: .*cora"):
        DATASETS.validate("coraa")
    with pytest.raises(SpecError, match="no parameter bogus"):
        DATASETS.validate("cora:bogus=1")
    # staged files carry the sha256 of shared/data/SHA256SUMS
    assert SPECS["cora"].files[0].checksum("planetoid/ind.cora.x") == "23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab"


def test_create_from_spec_string(tmp_path):
    d = tmp_path / "sentence-classification"
    d.mkdir()
    (d / "mpqa.all").write_bytes(b"1 good\n0 bad\n")
    data = DATASETS.create(f"mpqa:root={tmp_path}")
    assert len(data) == 2
    (tmp_path / "timeseries" / "mauna-loa-co2").mkdir(parents=True)
    (tmp_path / CO2_PATH).write_bytes(CO2)
    assert len(DATASETS.create({"name": "co2", "root": str(tmp_path), "end_year": 1958.25})) == 1


def test_check_reports_ok_missing_and_mismatch(tmp_path, monkeypatch):
    (tmp_path / "timeseries" / "mauna-loa-co2").mkdir(parents=True)
    (tmp_path / CO2_PATH).write_bytes(CO2)
    monkeypatch.setitem(datasets.SHA256, CO2_PATH, _sha(CO2))
    rep = check_dataset("co2", tmp_path)
    assert rep["status"] == "ok" and rep["sizes"] == "rows 2, features 1" and rep["present"] == [CO2_PATH]
    (tmp_path / CO2_PATH).write_bytes(CO2 + b"  1958   5   1958.3699     317.51     314.71     -1   -9.99   -0.99\n")
    assert check_dataset("co2", tmp_path)["status"] == "checksum-mismatch"
    miss = check_dataset("airline", tmp_path)
    assert miss["status"] == "missing"
    assert miss["missing"] == [str(tmp_path / "timeseries/airline-passengers/AirPassengers.csv")]
    assert "--download" in miss["hint"]
    iw = check_dataset("iwslt14", tmp_path)
    assert "no automatic download" in iw["hint"] and "prepare-iwslt14.sh" in iw["hint"]


def test_check_cli_output_and_exit_codes(tmp_path, monkeypatch, capsys):
    (tmp_path / "timeseries" / "mauna-loa-co2").mkdir(parents=True)
    (tmp_path / CO2_PATH).write_bytes(CO2)
    monkeypatch.setitem(datasets.SHA256, CO2_PATH, _sha(CO2))
    parser = argparse.ArgumentParser()
    cli_data.add_parser(parser.add_subparsers(dest="command"))
    assert cli_data.run(parser.parse_args(["data", "check", str(tmp_path), "-d", "co2"])) == 0
    out = capsys.readouterr().out
    assert "co2" in out and "ok" in out and "rows 2" in out
    assert cli_data.run(parser.parse_args(["data", "check", str(tmp_path), "-d", "co2", "-d", "cora"])) == 1
    out = capsys.readouterr().out
    assert str(tmp_path / "planetoid" / "ind.cora.x") in out
    # a whole-root scan with missing datasets is informative, not a failure
    assert cli_data.run(parser.parse_args(["data", "check", str(tmp_path)])) == 0
    assert "summary: " in capsys.readouterr().out
    assert cli_data.run(parser.parse_args(["data", "list"])) == 0
    listing = capsys.readouterr().out
    assert all(n in listing for n in ISSUE_NAMES)
    assert cli_data.run(parser.parse_args(["data", "check", "-d", "co2", "-d", "coraa"])) == 2
    err = capsys.readouterr().err
    assert err.startswith("kernel-attention: data check: unknown dataset 'coraa'; the staged datasets: wikitext-2")
    assert "graph," not in err  # the spec names of one's own files are no staged dataset


def test_download_refuses_plainly_when_offline(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr("urllib.request.urlopen", offline)
    lines = []
    rc = cli_data.run_check(str(tmp_path), ["airline"], download=True, out=lines.append)
    text = "\n".join(lines)
    assert rc == 1
    assert "offline" in text and str(tmp_path / "timeseries/airline-passengers/AirPassengers.csv") in text
    assert not (tmp_path / "timeseries").exists()
    with pytest.raises(DownloadError, match="offline"):
        DATASETS.create({"name": "airline", "root": str(tmp_path), "download": True})


def test_download_verifies_checksum(tmp_path, monkeypatch):
    monkeypatch.setitem(datasets.SHA256, CO2_PATH, _sha(CO2))
    written = ensure_files(SPECS["co2"], tmp_path, fetch=lambda url: CO2)
    assert written == [tmp_path / CO2_PATH] and (tmp_path / CO2_PATH).read_bytes() == CO2
    with pytest.raises(DownloadError, match="checksum mismatch"):
        ensure_files(SPECS["airline"], tmp_path, fetch=lambda url: b"tampered")
    assert not (tmp_path / "timeseries/airline-passengers/AirPassengers.csv").exists()


def test_download_uncompressed_upstream_and_zip_member(tmp_path):
    content = b"1 2 3\n"
    # staged gzipped, published uncompressed: stored as data.txt, verified against the content hash
    p = download_file(tmp_path, "uci/x/data.txt.gz", "https://example.invalid/data.txt",
                      {"uci/x/data.txt": _sha(content)}, fetch=lambda url: content)
    assert p == tmp_path / "uci/x/data.txt" and p.read_bytes() == content
    gz = gzip.compress(content)
    p = download_file(tmp_path, "uci/y/data.txt.gz", "https://example.invalid/data.txt.gz",
                      {"uci/y/data.txt.gz": _sha(gz)}, fetch=lambda url: gz)
    assert p.name == "data.txt.gz"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("wikitext-103/wiki.valid.tokens", " a b \n")
    calls = []
    fetch = lambda url: calls.append(url) or buf.getvalue()  # noqa: E731
    for split in ("valid", "valid"):
        p = download_file(tmp_path, f"wikitext-103/{split}.txt", "https://example.invalid/wt.zip", {},
                          member=f"wikitext-103/wiki.{split}.tokens", fetch=fetch)
    assert p.read_text() == " a b \n" and len(calls) == 1  # the archive is fetched once and cached
