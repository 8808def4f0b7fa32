"""``execute(name, options, out)``: run a study's unfinished cells, then write runs.csv, curves.csv, table.md,
figures/."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

from kernel_attention.atomic_write import write_text
from kernel_attention.machine import cpu
from kernel_attention.study.core import StudyOptions, get_study
from kernel_attention.study.curves import CURVES_CSV, cell_log, write_curves
from kernel_attention.study.report import render_tables, write_csv
from kernel_attention.study.runner import cell_dir, run_study

__all__ = ["execute", "machine"]


def machine() -> str:
    """This machine as a table's wall-time line names it; with the GPU the cells run on, if any
    (training picks ``cuda`` whenever it is available), and the malloc setting of the process
    (:mod:`kernel_attention.malloc`: it changes the CPU wall times of the blocked attention paths)."""
    import os
    import torch

    from kernel_attention.malloc import describe
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return (f"{platform.machine()} {cpu()}, {os.cpu_count()} CPU cores, {platform.system()}, torch "
            f"{torch.__version__}, {torch.get_num_threads()} thread(s){gpu}, malloc: {describe()}")


def execute(name: str, options: StudyOptions, out: str | Path, command: str = "", retry_errors: bool = False,
            figures: bool = True, log=print, run: bool = True, import_from: tuple = (),
            rerun_stale: bool = False, checkpoint_minutes: float | None = None) -> dict:
    """Import (``import_from``: runs.csv files, see :mod:`.carry`), run (unless ``run=False``) + collect;
    returns {"dir", "csv", "table", "figures", "results", "wall_s"}.  curves.csv (:mod:`.curves`) holds the
    curves of the finished cells whose log is here (their own, imported or a twin's)."""
    study = get_study(name)
    out = Path(out)
    sdir = out / study.folder(options.scale)
    sdir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    host = machine()
    recorded = json.loads((sdir / "study.json").read_text()) if (sdir / "study.json").is_file() else {}
    if not run and recorded:
        # Collecting only: the command and machine are those of the invocation that ran the cells
        # (they may have run elsewhere, e.g. on a GPU machine, and been copied here).
        command = command or recorded.get("command", "")
        host = recorded.get("machine", host)
    # What ran the records that name no command or machine (written before each record kept its own): a
    # study.json of that time says it in "command" and "machine"; later ones carry it on as "earlier".
    earlier = recorded.get("earlier", {"command": recorded.get("command", ""), "machine": recorded.get("machine", "")})
    cells, results, shrink = run_study(study, options, out, retry_errors=retry_errors, log=log, run=run,
                                      import_from=import_from, rerun_stale=rerun_stale,
                                      checkpoint_minutes=checkpoint_minutes, command=command if run else "")
    for line in shrink:
        log(f"  {options.scale} scale: {line}")
    csv_path = write_csv(sdir / "runs.csv", study, results)
    by_id = {c.id: c for c in cells}
    logs = {}
    for r in results:
        c = by_id.get(r.get("cell"))
        records = [] if c is None else cell_log(cell_dir(out, study, c), r)
        if records:
            logs[c.id] = (records, study.table(c.table).metric)
    write_curves(sdir / CURVES_CSV, logs)
    wall = sum(float(r.get("wall_s") or 0) for r in results)
    text = render_tables(study, results, shrink, options.scale, command, wall, host, earlier)
    write_text(sdir / "table.md", text)
    figs: list[str] = []
    if figures and study.figures is not None and results:
        try:
            figs = study.figures(sdir / "figures", cells, lambda c: cell_dir(out, study, c), results)
        except Exception as e:  # a figure must not lose the table
            log(f"  figures failed: {type(e).__name__}: {e}")
    write_text(sdir / "study.json", json.dumps({"study": name, "scale": options.scale, "command": command,
                                                "shrink": shrink, "cells": len(cells), "finished": len(results),
                                                "cell_wall_s": wall, "this_invocation_s": time.time() - t0,
                                                "machine": host, "earlier": earlier, "figures": figs}, indent=1))
    log(f"wrote {csv_path}, {sdir / 'table.md'}" + (f", {len(figs)} figure(s) in {sdir / 'figures'}" if figs else ""))
    return {"dir": sdir, "csv": csv_path, "table": sdir / "table.md", "figures": figs, "results": results,
            "wall_s": wall}
