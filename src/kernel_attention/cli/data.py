"""``kernel-attention data list`` and ``kernel-attention data check [PATH] [--download]``.

``list`` names every registered dataset with its parameters, files and source, and whether its files are
under the default root.  ``check`` verifies each dataset under PATH (checksums, then loads it) and prints
its split sizes, or what is missing, where to place it and where to get it.  Only ``--download`` goes to
the network; offline it says so and names the paths to place the files at.
Exit code of ``check``: 0 when every dataset that is present is intact (missing ones are only reported),
1 when a checksum does not match, a file cannot be read, a requested dataset is not there, or a download failed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("data", help="list the real datasets and check a local copy",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="data_command", metavar="ACTION")
    sub.add_parser("list", help="every dataset name, its parameters, files and source")
    c = sub.add_parser("check", help="what is present under PATH, with split sizes; what is missing")
    c.add_argument("path", nargs="?", default=None, help="data root (default: $KERNEL_ATTENTION_DATA, else "
                   "../shared/data if it exists, else ~/.cache/kernel-attention)")
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

    root = Path(path).expanduser() if path else default_root()
    try:
        wanted = [DATASETS.entry(n).name for n in names] if names else dataset_names()
    except SpecError as e:
        out(str(e))
        return 2
    wanted = list(dict.fromkeys(SPECS[n].name for n in wanted))
    own = [n for n in wanted if SPECS[n].by_path]
    if own:
        out(f"{', '.join(own)}: your own files, named by path= in the spec (e.g. {own[0]}:path=DIR); there is "
            f"nothing to check under a data root: `kernel-attention train CONFIG data.dataset={own[0]}:path=DIR "
            f"--check` reads them")
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


def _missing_line(r: dict) -> str:
    miss = r["missing"]
    more = f" (+{len(miss) - 1} more)" if len(miss) > 1 else ""
    return f"missing {miss[0]}{more}" if miss else ""
