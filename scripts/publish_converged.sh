#!/usr/bin/env bash
# Publish the converged cells of one study finished so far (others may still be training) as the result set
# docs/results/<study>-converged/, then regenerate docs/results.md:
#
#   [OUT=studies] bash scripts/publish_converged.sh dissection-kernels
#
# The study is collected in place (--collect-only: runs.csv, table.md and the figures of the finished cells
# with the current configuration), its runs.csv, curves.csv and figures are copied into the set's folder, and
# `kernel-attention study report` rewrites the page.  A set that is not on the page yet needs its prose.md
# (numbers through placeholders only) and an entry in docs/results/sections.yaml: the script says so and stops.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-studies}
KA=${KA:-.venv/bin/kernel-attention}
study=${1:?usage: publish_converged.sh STUDY}
set_dir=docs/results/$study-converged
if [ ! -f "$set_dir/prose.md" ] || ! grep -q "set: $study-converged\$" docs/results/sections.yaml; then
    echo "publish_converged.sh: $set_dir/prose.md and an entry 'set: $study-converged' in" \
         "docs/results/sections.yaml are needed first (see docs/guides/studies.md, Results)" >&2
    exit 2
fi
"$KA" study "$study" --scale converged --out "$OUT" --collect-only
cp "$OUT/$study-converged/runs.csv" "$OUT/$study-converged/curves.csv" "$set_dir/"
# A table's curves are drawn from its cells' metrics.jsonl, or for cells carried in with --import-runs from the
# curves.csv published beside the runs.csv (their curves.jsonl); cells published before curves.csv have neither.
# Where a variant (table, row, column) of a table has such cells only, the new figure lacks its curve (its title
# names the variant), so the committed figure, drawn where those cells trained, stays beside it as
# curves_<table>_where-trained.png; once every variant has curves here, that figure goes.  A committed figure
# not drawn here at all (the attention maps, drawn from checkpoints that stay where the cells trained) is kept.
cells=$OUT/$study-converged/cells
logged() {  # true when a cell of variant $1 (cells/<table>__<row>__<col>) has its curves here (moved aside: a dot)
    local dir
    for dir in "$1"__s*; do
        case $(basename "$dir") in *.*) continue ;; esac
        [ -f "$dir/metrics.jsonl" ] || [ -f "$dir/curves.jsonl" ] && return 0
    done
    return 1
}
lacks_curves() {  # true when some variant of table $1 has imported cells without curves only
    local dir
    for dir in "$cells/$1__"*; do
        case $(basename "$dir") in *.*) continue ;; esac
        grep -qs '"imported_from"' "$dir/result.json" && ! logged "${dir%__s*}" && return 0
    done
    return 1
}
for png in "$OUT/$study-converged/figures/"*.png; do
    [ -e "$png" ] || continue
    name=$(basename "$png"); table=${name#curves_}; table=${table%.png}
    aside=$set_dir/${name%.png}_where-trained.png
    if [[ $name == curves_* ]] && lacks_curves "$table"; then
        if [ -f "$set_dir/$name" ] && [ ! -f "$aside" ]; then
            mv "$set_dir/$name" "$aside"
            echo "moved the committed $name to $aside: a variant of table $table has imported cells only" \
                "(no curves here)"
        fi
    elif [ -f "$aside" ]; then
        rm "$aside"
    fi
    cp "$png" "$set_dir/"
done
for png in "$set_dir"/*.png; do
    case $png in *_where-trained.png) continue ;; esac
    if [ -e "$png" ] && [ ! -e "$OUT/$study-converged/figures/$(basename "$png")" ]; then
        echo "kept $png: not drawn here (from the cells' checkpoints or logs, where they trained)"
    fi
done
"$KA" study report
