"""``kernel-attention data list`` and ``kernel-attention data check [PATH] [--download]``.

``list`` names every registered dataset with its parameters, files and source, and whether its files are
under the default root.  ``check`` verifies each dataset under PATH (checksums, then loads it) and prints
its split sizes, or what is missing, where to place it and where to get it.  Only ``--download`` goes to
the network; offline it says so and names the paths to place the files at.
Exit code of ``check``: 0 when every dataset that is present is intact (missing ones are only reported),
1 when a checksum does not match, a file cannot be read, a requested dataset is not there, or a download failed.

``check PATH`` on a folder or file of your own data (one that holds no staged dataset's folder), or on its
spec (``graph:path=DIR,id=paper``), says what it detected: the spec that reads it, the task it serves, the
splits (files, a column, or made by ratio), the sizes and the vocabulary, classes or columns.  Exit code 0
when it reads, 1 when a file of it cannot be read, 2 when PATH does not exist or holds no known layout.

``check CONFIG.yaml`` checks the data a config's ``data:`` section names: the user's own files as above, or a
staged dataset under the config's data root.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("data", help="list the real datasets and check a local copy",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="data_command", metavar="ACTION")
    sub.add_parser("list", help="every dataset name, its parameters, files and source")
    c = sub.add_parser("check", help="what is present under PATH, with split sizes; what is missing")
    c.add_argument("path", nargs="?", default=None, help="data root (default: $KERNEL_ATTENTION_DATA, else "
                   "../shared/data if it exists, else ~/.cache/kernel-attention); or a folder or file of your own "
                   "data, or its spec (graph:path=DIR,id=paper): what it holds, for which task; or a config file "
                   "(.yaml): the data it names")
    c.add_argument("--dataset", "-d", action="append", default=None, help="check only this dataset (repeatable)")
    c.add_argument("--download", action="store_true", help="fetch missing files into PATH from their public source")
    c.add_argument("--no-verify", action="store_true", help="skip sha256 verification")
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def run(args) -> int:
    if getattr(args, "data_command", None) == "list":
        return run_list()
    if getattr(args, "data_command", None) == "check":
        return run_check(args.path, args.dataset, args.download, not args.no_verify, args.json)
    print("usage: kernel-attention data {list,check} ...  (see kernel-attention data --help)")
    return 2


def run_list(out=print) -> int:
    from kernel_attention.data.datasets import DATASETS, SPECS, _locate, dataset_names
    from kernel_attention.data.files import default_root

    root = default_root()
    out(f"default data root: {root}  (set KERNEL_ATTENTION_DATA to change it)")
    for name in dataset_names():
        spec = SPECS[name]
        required = [f for f in spec.files if not f.optional]
        have = sum(_locate(root, f) is not None for f in required)
        alias = f" (alias: {', '.join(spec.aliases)})" if spec.aliases else ""
        out(f"\n{DATASETS.entry(name).signature()}{alias}")
        out(f"    kind {spec.kind}; {have}/{len(required)} files under the default root; "
            f"e.g. {required[0].path}")
        out(f"    source: {spec.source}")
        if spec.note:
            out(f"    note: {spec.note}")
    return 0


def run_check(path: str | None, names: list[str] | None = None, download: bool = False, verify: bool = True,
              as_json: bool = False, out=print, fetch=None) -> int:
    from kernel_attention.data.datasets import DATASETS, SPECS, check_dataset, dataset_names, ensure_files
    from kernel_attention.data.download import DownloadError
    from kernel_attention.data.files import MissingDataError, default_root
    from kernel_attention.registry import SpecError

    if path and not names and Path(path).suffix in (".yaml", ".yml") and Path(path).is_file():
        named = _config_data(path)
        if isinstance(named, int):
            return named
        path, names = named
    own = _own_data(path, names, download)
    if own is not None:
        return own if isinstance(own, int) else run_check_own(own, as_json, out)
    root = Path(path).expanduser() if path else default_root()
    wanted = []
    for n in names or dataset_names():
        try:
            wanted.append(DATASETS.entry(n).name)
        except SpecError:
            print(f"kernel-attention: data check: unknown dataset {n!r}; the staged datasets: "
                  f"{', '.join(dataset_names())} (your own files: data check PATH)", file=sys.stderr)
            return 2
    wanted = list(dict.fromkeys(SPECS[n].name for n in wanted))
    own = [n for n in wanted if SPECS[n].by_path]
    if own:
        out(f"{', '.join(own)}: your own files, named by path= in the spec (e.g. {own[0]}:path=DIR); there is "
            f"nothing to check under a data root: `kernel-attention data check DIR` describes them")
        return 2
    failed = False
    if download:
        for n in wanted:
            rep = check_dataset(n, root, verify=False, load=False)
            if rep["status"] == "ok":
                continue
            try:
                for p in ensure_files(SPECS[n], root, fetch):
                    out(f"downloaded {p}")
            except (DownloadError, MissingDataError) as e:
                out(f"{n}: download failed: {e}")
                failed = True
    reports = [check_dataset(n, root, verify=verify) for n in wanted]
    if not root.is_dir():
        out(f"data root {root} does not exist; create it and place the files there, or pass --download")
    if as_json:
        out(json.dumps({"root": str(root), "datasets": reports}, indent=1))
    else:
        out(f"data root: {root}")
        for r in reports:
            out(f"  {r['name']:<13} {r['status']:<17} " + (r["sizes"] or _missing_line(r)))
            if r["mismatched"]:
                out(f"  {'':<13} {'':<17} sha256 differs: {', '.join(r['mismatched'])}")
            if r["status"] in ("missing", "incomplete"):
                out(f"  {'':<13} {'':<17} {r['hint']}")
            if r["note"] and r["status"] != "ok":
                out(f"  {'':<13} {'':<17} note: {r['note']}")
        counts: dict[str, list[str]] = {}
        for r in reports:
            counts.setdefault(r["status"], []).append(r["name"])
        out("summary: " + "; ".join(f"{k} {len(v)}" + ("" if k == "ok" else f" ({', '.join(v)})") for k, v in counts.items()))
    for r in reports:
        if r["status"] in ("checksum-mismatch", "unreadable") or (names and r["status"] != "ok"):
            failed = True
    return 1 if failed else 0


def _config_data(path: str) -> tuple[str | None, list[str] | None] | int:
    """What the config file ``path`` names in ``data:``: ``(spec, None)`` for the user's own files (a by-path
    spec), ``(data root or None, [dataset])`` for a staged dataset; 2 after a message when it names none."""
    from kernel_attention.config import ConfigError, load_config
    from kernel_attention.data.datasets import DATASETS, SPECS
    from kernel_attention.registry import SpecError, parse_spec, spec_string
    from kernel_attention.tasks.data_source import dataset_spec

    try:
        spec = dataset_spec(load_config(path).get("data"), f"config {path}")
        name = DATASETS.validate(spec)[0]
    except (ConfigError, SpecError) as e:
        print(f"kernel-attention: data check: {e}", file=sys.stderr)
        return 2
    params = parse_spec(spec)[1]  # as the config gives them, without the defaults
    if not SPECS[name].by_path:
        return params.get("root"), [name]
    return spec_string(name, params), None


def _own_data(path: str | None, names, download: bool) -> str | int | None:
    """``path`` when it names the user's own data (a by-path spec, a file, or a folder that is no data root
    and holds one of their layouts), 2 (after a message) when it does not exist or is a folder with files
    but neither a staged dataset nor a layout, else None: a data root (one with a staged dataset, or empty)."""
    from kernel_attention.data.datasets import SPECS
    from kernel_attention.data.files import DataFormatError, MissingDataError
    from kernel_attention.data.own_check import detect_spec

    if path is None or names or download:
        return None
    head = path.split(":", 1)[0]
    if ":" in path and head in SPECS and SPECS[head].by_path:
        return path
    p = Path(path).expanduser()
    if not p.exists() and not Path(str(p) + ".gz").exists():
        try:
            detect_spec(path)  # a spec of no by-path dataset says so
        except MissingDataError as e:
            if ":" in path and "=" in path:
                print(f"kernel-attention: data check: {e}", file=sys.stderr)
                return 2
        print(f"kernel-attention: data check: {path} does not exist; give a data root (the staged datasets), or a "
              f"folder or file of your own data (text, parallel text, a TSV/CSV table, a graph folder)",
              file=sys.stderr)
        return 2
    if p.is_dir():
        staged = {f.path.split("/")[0] for spec in SPECS.values() for f in spec.files}
        if any((p / top).exists() for top in staged):
            return None
        try:
            detect_spec(path)
        except MissingDataError as e:
            if not any(p.iterdir()):
                return None  # an empty folder: checked as a data root, which says what to place there
            print(f"kernel-attention: data check: {e}; as a data root it holds no staged dataset's folder "
                  f"(docs/data.md)", file=sys.stderr)
            return 2
        except (DataFormatError, ValueError):
            pass  # a layout whose file does not read: run_check_own names the file and line
    return path


def run_check_own(path: str, as_json: bool = False, out=print) -> int:
    """Describe the user's own data at ``path`` (a folder, a file or a by-path spec): exit 0 when it reads,
    1 when a file of it cannot be read as detected, 2 when nothing there is recognised or the spec is bad."""
    from kernel_attention.data.files import DataFormatError, MissingDataError
    from kernel_attention.data.own_check import describe_own
    from kernel_attention.registry import SpecError

    try:
        rep = describe_own(path)
    except (MissingDataError, SpecError) as e:
        print(f"kernel-attention: data check: {e}", file=sys.stderr)
        return 2
    except (DataFormatError, ValueError) as e:
        print(f"kernel-attention: data check {path}: unreadable: {e}", file=sys.stderr)
        return 1
    if as_json:
        out(json.dumps(rep, indent=1))
        return 0
    out(f"{path}: your own data, read as {rep['spec']}")
    out(f"  task       {rep['task']} (kind {rep['kind']})")
    out(f"  files      {', '.join(rep['files'])}")
    out(f"  splits     {rep['splits']}")
    out(f"  sizes      {rep['sizes']}")
    if "lines" in rep:
        out("  lines      " + " / ".join(f"{k} {v:,}" for k, v in rep["lines"].items()))
    if "vocabulary" in rep:
        v = rep["vocabulary"]
        out(f"  vocabulary {v:,} words" if isinstance(v, int) else
            "  vocabulary " + ", ".join(f"{k} {n:,} words" for k, n in v.items()) + " (training split)")
    if "classes" in rep:
        out("  classes    " + ", ".join(f"{k} {n:,}" for k, n in rep["classes"].items()))
    if "columns" in rep:
        out(f"  columns    features {', '.join(rep['columns']['features'])}; target {rep['columns']['target']}")
    out("  checksums  none: your own files (sha256 is verified for the datasets the project stages)")
    return 0


def _missing_line(r: dict) -> str:
    miss = r["missing"]
    more = f" (+{len(miss) - 1} more)" if len(miss) > 1 else ""
    return f"missing {miss[0]}{more}" if miss else ""
