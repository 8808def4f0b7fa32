#!/usr/bin/env bash
# Bring the finished cells of a studies folder made on another machine (the studies.tar.gz a GPU window of
# scripts/study_on_gpu.sh returns, or that folder unpacked) into this machine's studies folder, then collect
# each study they belong to:
#
#   [OUT=studies] bash scripts/import_cells.sh PATH/studies.tar.gz      (or PATH/studies)
#
# A cell is finished where its folder holds a result.json of status ok (a failed cell is not imported: it is
# trained here); its result.json, metrics.jsonl and config.yaml are copied (a window brings back no
# checkpoints).  A cell finished here already, or being trained here (another process holds its running.lock),
# is left as it is; a cell started here and not finished takes the imported result, and its checkpoints are
# kept beside it as last.pt.replaced and best.pt.replaced.  Each line of output names a cell and what was done
# with it.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-studies}
KA=${KA:-.venv/bin/kernel-attention}
PY=${PYTHON:-python3}
src=${1:?usage: import_cells.sh STUDIES.tar.gz|STUDIES_DIR}
if [ -f "$src" ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    tar xzf "$src" -C "$tmp"
    src=$tmp/studies
fi
[ -d "$src" ] || { echo "import_cells.sh: $src is neither a studies folder nor a .tar.gz of one" >&2; exit 2; }
declare -A sets=()
for res in "$src"/*/cells/*/result.json; do
    [ -e "$res" ] || continue
    from=$(dirname "$res")
    cell=$(basename "$from")
    set_dir=$(basename "$(dirname "$(dirname "$from")")")
    dest=$OUT/$set_dir/cells/$cell
    if ! $PY -c 'import json, sys; sys.exit(json.load(open(sys.argv[1])).get("status") != "ok")' "$res"; then
        echo "$set_dir/$cell: did not finish ok there, not imported"
        continue
    fi
    if [ -f "$dest/result.json" ]; then
        echo "$set_dir/$cell: finished here already, left as it is"
        continue
    fi
    if [ -f "$dest/running.lock" ] && ! flock -n "$dest/running.lock" true; then
        echo "$set_dir/$cell: being trained here, left as it is"
        continue
    fi
    mkdir -p "$dest"
    for f in last.pt best.pt; do
        if [ -f "$dest/$f" ]; then mv "$dest/$f" "$dest/$f.replaced"; fi
    done
    for f in result.json metrics.jsonl config.yaml; do
        if [ -f "$from/$f" ]; then cp "$from/$f" "$dest/$f"; fi
    done
    echo "$set_dir/$cell: imported"
    sets[$set_dir]=1
done
for set_dir in "${!sets[@]}"; do
    case $set_dir in  # a study's folder is NAME at the small scale, NAME-SCALE at the others
        *-converged) name=${set_dir%-converged} scale=converged ;;
        *-paper) name=${set_dir%-paper} scale=paper ;;
        *) name=$set_dir scale=small ;;
    esac
    "$KA" study "$name" --scale "$scale" --out "$OUT" --collect-only | tail -n 1
done
