#!/usr/bin/env bash
# Publish the converged cells of one study finished so far (others may still be training) as the result set
# docs/results/<study>-converged/, then regenerate docs/results.md:
#
#   [OUT=studies] bash scripts/publish_converged.sh dissection-kernels
#
# The study is collected in place (--collect-only: runs.csv, table.md and the figures of the finished cells
# with the current configuration), its runs.csv and figures are copied into the set's folder, and
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
cp "$OUT/$study-converged/runs.csv" "$set_dir/"
# A table's curves are drawn from its cells' metrics.jsonl; cells carried in with --import-runs have none, so
# where a table holds such cells its committed figure (drawn where they trained) is kept rather than redrawn
# without their curves.
for png in "$set_dir"/*.png "$OUT/$study-converged/figures/"*.png; do
    [ -e "$png" ] || continue
    name=$(basename "$png"); table=${name#curves_}; table=${table%.png}
    if [ -f "$set_dir/$name" ] && grep -qs '"imported_from"' "$OUT/$study-converged/cells/${table}__"*/result.json; then
        [ "$png" = "$set_dir/$name" ] && echo "kept $set_dir/$name: table $table holds imported cells (no curves here)"
    elif [ "$png" = "$set_dir/$name" ]; then
        rm -f "$png"
    else
        cp "$png" "$set_dir/"
    fi
done
"$KA" study report
