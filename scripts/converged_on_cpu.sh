#!/usr/bin/env bash
# The converged study cells on this machine's CPU, one process per core, in the order the results need them:
# the SP baseline (TD Table 1's Vaswani row, whose perplexity is the bar the LM cells are read against), the NMT
# columns of TD Tables 1-4, IKA Table 3, then the SP columns of TD Tables 1-4.  Among the NMT columns, Tables 3
# and 4 (few cells to train, the rest carried over from Table 1) come before the rest of Table 2, so that each
# table's comparisons have seeds early; of Table 2, the linear rows (the table's main finding, against the
# exponential kernel of Table 1) come first.  The SP columns follow the same rule: first the cells whose partners
# are Table 1's cells (Table 3's no-PE row, Table 4, Table 2's asymmetric column), then Table 2's symmetric
# column, whose exponential partner is trained there too.
#
#   [PROCS=2] [OUT=studies] [LOGS=studies/logs] nohup bash scripts/converged_on_cpu.sh > studies/queue.log 2>&1 &
#
# LOGS names the folder of the processes' logs (queue.<i>.log): another one for a second run of the script
# beside a running one, say one more process on a core that came free.
# Each process walks the same queue; the runner's cell locks keep two processes off one cell, finished cells
# are skipped and unfinished ones resume from their last.pt, so the script can be stopped (kill its process
# group; a SIGTERM to one study process ends that process's walk) and started again at any time; a cell
# finished under a smaller train.max_steps trains on from its last.pt (study/extend.py).  Cells whose
# configuration equals one finished in another study under the same OUT (TD Table 1 shares cells with Tables 3
# and 4, see study/twins.py) are carried over, not trained again.  The cells already published
# (docs/results/<study>-converged/runs.csv) are imported first (--import-runs), so that on a new machine the
# queue goes on where the published results stop.  Each study is collected (runs.csv, table.md, figures) after
# its cells; scripts/publish_converged.sh publishes them;
# `study NAME --scale converged --collect-only` collects the cells finished so far while others train.
set -uo pipefail
cd "$(dirname "$0")/.."
PROCS=${PROCS:-$(nproc)}
OUT=${OUT:-studies}
KA=${KA:-.venv/bin/kernel-attention}
LOGS=${LOGS:-$OUT/logs}
QUEUE=(dissection-positions:t1-sp/vaswani
       dissection-positions:t1-nmt dissection-kernels:t2-nmt/linear dissection-order:t3-nmt
       dissection-values:t4-nmt ika-translation: dissection-kernels:t2-nmt
       dissection-positions:t1-sp dissection-order:t3-sp dissection-values:t4-sp dissection-kernels:t2-sp/sp-asym
       dissection-kernels:t2-sp)
mkdir -p "$LOGS"
walk() {
    for set in "${QUEUE[@]}"; do
        name=${set%%:*}; only=${set#*:}
        csv=docs/results/$name-converged/runs.csv
        "$KA" study "$name" --scale converged ${only:+--only "$only"} --out "$OUT" --threads 1 --no-figures \
            $([ -f "$csv" ] && echo --import-runs "$csv")
        status=$?
        # a study stopped by a signal (exit 128 + signum) was asked to stop: its walk ends there, not at the next set
        if [ "$status" -ge 128 ]; then echo "walk stopped: $name exited $status" >&2; return "$status"; fi
    done
}
for i in $(seq "$PROCS"); do
    walk > "$LOGS/queue.$i.log" 2>&1 &
    sleep 5
done
wait
for name in dissection-positions dissection-kernels dissection-order dissection-values ika-translation; do
    "$KA" study "$name" --scale converged --out "$OUT" --collect-only
done
