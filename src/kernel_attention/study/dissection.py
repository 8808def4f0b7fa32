"""Transformer Dissection Tables 1-4 as studies (NMT and SP columns; protocol: best validation of N seeds).

Each cell starts from the shipped paper config ``configs/transformer_dissection/tableK/<file>.yaml``.
``--scale paper`` runs it as is, with the paper's data (IWSLT'14 De-En, WikiText-103: neither is staged in
../shared/data, pass ``--nmt-data``/``--lm-data`` or place them under ``--data``).  The two other scales run
on Multi30k De-En / WikiText-2 and list what they change word for word in table.md:

* ``--scale small`` (:data:`SMALL_NMT` / :data:`SMALL_SP`): minutes per cell, a check that every cell runs;
* ``--scale converged`` (:data:`CONVERGED_NMT` / :data:`CONVERGED_SP`): models sized for the staged data,
  trained until the validation metric stops improving (``train.patience`` evaluations without a better
  score, then the best checkpoint is tested), three seeds; the scale whose paired differences the results
  page marks.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any, Callable

import yaml

from kernel_attention.study.core import Cell, Study, StudyOptions, TableSpec, register_study
from kernel_attention.study.figures import training_curves

__all__ = ["SMALL_NMT", "SMALL_SP", "CONVERGED_NMT", "CONVERGED_SP", "SCALES", "load_paper_config", "cell_base",
           "shrink_nmt", "shrink_sp", "CONFIG_ROOT"]

CONFIG_ROOT = Path(__file__).resolve().parents[3] / "configs"

SMALL_NMT = {
    "task": {"max_tokens": 2048, "bpe_vocab_size": 2000, "max_len": 64},
    "model": {"d_model": 64, "n_heads": 4, "d_ff": 128, "enc_layers": 1, "dec_layers": 1, "dropout": 0.1},
    "train": {"max_steps": 300, "lr": 1e-3, "eval_every": 150, "checkpoint_every": 50,
              "schedule": {"name": "inverse_sqrt", "warmup": 100, "warmup_init_lr": 1e-7}},
    "eval": {"beam": 1, "max_sentences": 200, "batch_size": 100},
}


class _Removed:
    """A scale's change that removes a setting from the paper's config (None is a setting's value)."""

    def __repr__(self) -> str:
        return "removed"


REMOVED = _Removed()

#: the small LM has a full soft-max tied to its input embedding: WikiText-2's 33k words are fewer than the last
#: cutoff of the paper's adaptive soft-max
SMALL_SP = {
    "task": {"batch_size": 8, "tgt_len": 32},
    "model": {"d_model": 64, "n_heads": 4, "d_head": 16, "d_ff": 128, "n_layers": 2, "mem_len": 32,
              "adaptive": REMOVED},
    "train": {"max_steps": 200, "lr": 1e-3, "eval_every": 0, "checkpoint_every": 50, "test_best": False},
    "eval": {"tgt_len": 32, "mem_len": 32, "clamp_len": 64, "batch_size": 60},
}

#: Multi30k De-En: a 2+2-layer, d_model 128 Transformer with one joint 8k BPE vocabulary, trained in bfloat16
#: autocast (direct kernels stay float32) with a peak learning rate of 2e-3 (half the Noam schedule's at
#: d_model 128 and 500 warm-up steps); BLEU (sacreBLEU, greedy) on the whole valid split every 500 updates
#: picks the checkpoint, three evaluations without a better one end the cell.
CONVERGED_NMT = {
    "task": {"max_tokens": 4096, "bpe_vocab_size": 8000, "joint_bpe": True, "max_len": 100},
    "model": {"d_model": 128, "n_heads": 4, "d_ff": 512, "enc_layers": 2, "dec_layers": 2, "dropout": 0.2,
              "share_embeddings": True},
    "train": {"max_steps": 6000, "lr": 2e-3, "eval_every": 500, "patience": 3, "checkpoint_every": 250,
              "precision": "bf16", "schedule": {"name": "inverse_sqrt", "warmup": 500, "warmup_init_lr": 1e-7}},
    "eval": {"beam": 1, "bleu": "sacrebleu", "max_sentences": None, "batch_size": 200},
}
#: WikiText-2 (word level, 33k words): a 2-layer, d_model 256 Transformer-XL-style LM over 64-token segments
#: with 64 cached steps and an adaptive soft-max (the 33k-word output layer would otherwise cost most of each
#: step), trained in bfloat16 autocast; perplexity on the whole valid split every 500 updates, patience 3.
CONVERGED_SP = {
    "task": {"batch_size": 16, "tgt_len": 64},
    "model": {"d_model": 256, "n_heads": 4, "d_head": 64, "d_ff": 1024, "n_layers": 2, "dropout": 0.2,
              "mem_len": 64, "tie_output": False, "adaptive": {"cutoffs": [2000, 10000], "div_value": 4.0}},
    "train": {"max_steps": 12000, "lr": 1e-3, "eval_every": 500, "patience": 3, "checkpoint_every": 250,
              "precision": "bf16", "schedule": {"name": "inverse_sqrt", "warmup": 500, "warmup_init_lr": 1e-7}},
    "eval": {"tgt_len": 64, "mem_len": 64, "clamp_len": 128, "batch_size": 32},
}


def _describe(d: dict, prefix: str) -> list[str]:
    return [f"{prefix}: {sec}.{k} = {v}" if v is not REMOVED else f"{prefix}: {sec}.{k} removed"
            for sec, kv in d.items() for k, v in kv.items()]


SHRINK_NMT = ["NMT data: Multi30k De-En (IWSLT'14 is not staged); BLEU of greedy decoding on the first 200 "
              "valid/test sentences"] + _describe(SMALL_NMT, "NMT")
SHRINK_SP = ["SP data: WikiText-2 (WikiText-103 is not staged); one evaluation on the full valid and test "
             "split at the end of training (no selection over checkpoints)"] + _describe(SMALL_SP, "SP")
CONVERGE_NMT = ["NMT data: Multi30k De-En (IWSLT'14 is not staged); sacreBLEU of greedy decoding on the whole "
                "valid split picks the checkpoint, the whole test_2016_flickr split scores it"] + \
    _describe(CONVERGED_NMT, "NMT")
CONVERGE_SP = ["SP data: WikiText-2 (WikiText-103 is not staged); perplexity on the whole valid split picks the "
               "checkpoint, the whole test split scores it"] + _describe(CONVERGED_SP, "SP")


def load_paper_config(rel: str) -> dict[str, Any]:
    path = CONFIG_ROOT / rel
    if not path.is_file():
        raise FileNotFoundError(f"paper config {path} is missing (generate it: python configs/make_configs.py)")
    return yaml.safe_load(path.read_text())


def cell_base(rel: str, shrink: Callable[[dict], dict] | None, dataset: Any) -> dict[str, Any]:
    """The configuration a study's cells of one (row, column) start from: the paper's config ``rel`` without
    its ``run`` section (the study names each cell's folder), passed through ``shrink`` (the scale's change of
    it; None at paper scale), reading ``dataset`` (:meth:`.core.StudyOptions.dataset`)."""
    base = load_paper_config(rel)
    base.pop("run", None)
    if shrink is not None:
        base = shrink(base)
    base["data"] = {"dataset": dataset}
    return base


def _merge(cfg: dict, over: dict) -> dict:
    """``cfg`` with each section updated by ``over``'s; a setting :data:`REMOVED` in ``over`` is removed."""
    cfg = copy.deepcopy(cfg)
    for sec, kv in over.items():
        merged = {**(cfg.get(sec) or {}), **{k: copy.deepcopy(v) for k, v in kv.items() if v is not REMOVED}}
        cfg[sec] = {k: v for k, v in merged.items() if kv.get(k) is not REMOVED}
    return cfg


def shrink_nmt(cfg: dict, over: dict = SMALL_NMT) -> dict:
    return _merge(cfg, over)


def shrink_sp(cfg: dict, over: dict = SMALL_SP) -> dict:
    cfg = _merge(cfg, over)
    cfg["train"].pop("max_epochs", None)
    return cfg


#: scale -> (NMT config change, SP config change, the lines that list them); ``paper`` changes nothing
SCALES: dict[str, tuple[Callable[[dict], dict], Callable[[dict], dict], list[str], list[str]]] = {
    "small": (shrink_nmt, shrink_sp, SHRINK_NMT, SHRINK_SP),
    "converged": (functools.partial(shrink_nmt, over=CONVERGED_NMT), functools.partial(shrink_sp, over=CONVERGED_SP),
                  CONVERGE_NMT, CONVERGE_SP),
}


def _cells(study: str, opts: StudyOptions, spec: list[tuple[str, str, str, str]], seeds: int,
           nmt_data: str | None, lm_data: str | None) -> tuple[list[Cell], list[str]]:
    """spec: (table, row, col, config path under configs/); the config's task (translation or language
    modelling) picks the shrink and the dataset."""
    change = SCALES.get(opts.scale)   # None at paper scale
    nmt_ds = nmt_data or ("multi30k" if change else "iwslt14")
    lm_ds = lm_data or ("wikitext-2" if change else "wikitext-103")
    cells, kinds = [], set()
    for table, row, col, rel in spec:
        kind = "nmt" if load_paper_config(rel)["task"]["name"] == "translation" else "sp"
        kinds.add(kind)
        base = cell_base(rel, change[0 if kind == "nmt" else 1] if change else None,
                         opts.dataset(nmt_ds if kind == "nmt" else lm_ds))
        for s in range(seeds):
            cfg = copy.deepcopy(base)
            cfg["seed"] = int(base.get("seed", 1)) + s
            cells.append(Cell(study, table, row, col, cfg["seed"], cfg, {"config": rel, "kind": kind}))
    shrink = []
    if change:
        shrink += change[2] if "nmt" in kinds else []
        shrink += change[3] if "sp" in kinds else []
    else:
        shrink += [f"data: NMT {nmt_ds}, SP {lm_ds}"]
    return cells, shrink


def _td_figures(study: Study):
    def figures(fig_dir: Path, cells, dir_of, results) -> list[str]:
        out = [training_curves(fig_dir, t, cells, dir_of, results) for t in study.tables]
        return [p for p in out if p]
    return figures


def _td_study(name, title, tables, spec_fn, notes=()):
    seeds = {"small": 1, "converged": 3, "paper": 5}

    def build(opts: StudyOptions, _fn=spec_fn):
        n = opts.seeds or seeds[opts.scale]
        return _cells(name, opts, _fn(), n, opts.nmt_data, opts.lm_data)

    st = Study(name, title, "best_valid", tables, build, seeds, notes=list(notes))
    st.figures = _td_figures(st)
    return register_study(st)


# ---- Table 1: positional embedding ------------------------------------------------------------------
_T1_ROWS = [("vaswani", "Vaswani (Eq. 4), direct sum"), ("shaw", "Shaw (Eq. 6), look-up table"),
            ("xl", "Dai / Transformer-XL (Eq. 5), product kernel"), ("eq9", "Ours (Eq. 9), symmetric product kernel")]
_T1_PAPER = {("vaswani", "nmt"): "33.98", ("vaswani", "sp"): "30.97", ("shaw", "nmt"): "34.12",
             ("shaw", "sp"): "27.56", ("xl", "nmt"): "33.62", ("xl", "sp"): "24.10", ("eq9", "nmt"): "34.71",
             ("eq9", "sp"): "24.28"}
_td_study(
    "dissection-positions", "Transformer Dissection Table 1: incorporating positional embedding",
    [TableSpec("t1-nmt", "Table 1, NMT (BLEU)", "bleu", True, _T1_ROWS, [("nmt", "NMT BLEU")], _T1_PAPER),
     TableSpec("t1-sp", "Table 1, SP (perplexity)", "ppl", False, _T1_ROWS, [("sp", "SP ppl")], _T1_PAPER)],
    lambda: [(f"t1-{k}", r, k, f"transformer_dissection/table1/{k}_{r}.yaml")
             for k in ("sp", "nmt") for r, _ in _T1_ROWS])

# ---- Table 2: kernel types ----------------------------------------------------------------------------
_T2_ROWS = [("linear", "linear"), ("poly", "polynomial (degree 2)"), ("exp", "exponential"), ("rbf", "RBF")]
_T2_PAPER = {}
for _r, _v in {"linear": ("not converge",) * 4, "poly": ("32.72", "32.43", "25.91", "26.25"),
               "exp": ("33.98", "33.78", "24.10", "24.01"), "rbf": ("34.26", "34.14", "24.13", "24.21")}.items():
    for _c, _x in zip(("asym", "sym"), _v[:2]):
        _T2_PAPER[(_r, f"nmt-{_c}")] = _x
    for _c, _x in zip(("asym", "sym"), _v[2:]):
        _T2_PAPER[(_r, f"sp-{_c}")] = _x
_td_study(
    "dissection-kernels", "Transformer Dissection Table 2: kernel types (asymmetric W_q != W_k, symmetric W_q = W_k)",
    [TableSpec("t2-nmt", "Table 2, NMT (BLEU)", "bleu", True, _T2_ROWS,
               [("nmt-asym", "NMT asym"), ("nmt-sym", "NMT sym")], _T2_PAPER),
     TableSpec("t2-sp", "Table 2, SP (perplexity)", "ppl", False, _T2_ROWS,
               [("sp-asym", "SP asym"), ("sp-sym", "SP sym")], _T2_PAPER)],
    lambda: [(f"t2-{k}", r, f"{k}-{s}", f"transformer_dissection/table2/{k}_{r}_{s}.yaml")
             for k in ("sp", "nmt") for r, _ in _T2_ROWS for s in ("asym", "sym")])

# ---- Table 3: order invariance ------------------------------------------------------------------------
_T3_NMT = [("eq9_abc", "Eq. 9, PE in A/B/C"), ("eq9_ab", "Eq. 9, PE in A/B"), ("no_pe", "no PE")]
_T3_SP = [("vaswani_c", "Vaswani (Eq. 4), PE in C"), ("eq9_c", "Eq. 9, PE in C"), ("no_pe", "no PE")]
_td_study(
    "dissection-order", "Transformer Dissection Table 3: order invariance (A enc self, B enc-dec, C dec self)",
    [TableSpec("t3-nmt", "Table 3, NMT (BLEU)", "bleu", True, _T3_NMT, [("nmt", "NMT BLEU")],
               {("eq9_abc", "nmt"): "34.71", ("eq9_ab", "nmt"): "34.49", ("no_pe", "nmt"): "14.47"}),
     TableSpec("t3-sp", "Table 3, SP (perplexity)", "ppl", False, _T3_SP, [("sp", "SP ppl")],
               {("vaswani_c", "sp"): "30.97", ("eq9_c", "sp"): "24.28", ("no_pe", "sp"): "30.92"})],
    lambda: [("t3-sp", r, "sp", f"transformer_dissection/table3/sp_{r}.yaml") for r, _ in _T3_SP]
    + [("t3-nmt", r, "nmt", f"transformer_dissection/table3/nmt_{r}.yaml") for r, _ in _T3_NMT])

# ---- Table 4: PE in the value function ----------------------------------------------------------------
_T4_ROWS = [("vaswani", "Vaswani (Eq. 4)"), ("shaw", "Shaw (Eq. 6)"), ("xl", "Dai (Eq. 5)"), ("eq9", "Eq. 9")]
_T4_PAPER = {}
for _r, _v in {"vaswani": ("33.98", "34.02", "30.97", "30.50"), "shaw": ("34.04", "34.12", "27.56", "27.45"),
               "xl": ("33.32", "33.62", "24.18", "24.10"), "eq9": ("34.60", "34.71", "24.42", "24.28")}.items():
    for _c, _x in zip(("nmt-I", "nmt-II", "sp-I", "sp-II"), _v):
        _T4_PAPER[(_r, _c)] = _x
_td_study(
    "dissection-values", "Transformer Dissection Table 4: PE in the value function (I: (f+t)W_V, II: f W_V)",
    [TableSpec("t4-nmt", "Table 4, NMT (BLEU)", "bleu", True, _T4_ROWS, [("nmt-I", "NMT I"), ("nmt-II", "NMT II")],
               _T4_PAPER),
     TableSpec("t4-sp", "Table 4, SP (perplexity)", "ppl", False, _T4_ROWS, [("sp-I", "SP I"), ("sp-II", "SP II")],
               _T4_PAPER)],
    lambda: [(f"t4-{k}", r, f"{k}-{v}", f"transformer_dissection/table4/{k}_{r}_value_{v}.yaml")
             for k in ("sp", "nmt") for r, _ in _T4_ROWS for v in ("I", "II")],
    notes=["Vaswani rows of Table 4 keep t apart from f at every layer (per-layer direct sum, "
           "position=absolute), as the shipped configs do; see configs/make_configs.py."])
