#!/usr/bin/env bash
# Issue 40's proof, one device call per step: fuzz every impl with expectation entries, --new-only,
# several searches side by side on one machine, then audit what they judged against the
# expectations and keep the records (written for the H200, where the next session runs it; tried on
# the CPU: DEVICE=cpu BUDGET=20 tools/model_proof.sh fuzz /tmp/proof torch neg-no-restore).
#
#   tools/model_proof.sh fuzz OUT IMPL...     fuzz each IMPL for $BUDGET s (default 120) on $DEVICE
#                                             (default cuda, every capture mode), $PARALLEL at once
#                                             (default 8: 16 on one 80 GB GPU ran it out of memory),
#                                             seeds $SEED0 (default 4001) upwards, each stopped at
#                                             $LIMIT s (default twice the budget); each report in
#                                             OUT/f_IMPL, its log in OUT/IMPL.log
#   tools/model_proof.sh matrix OUT           the default matrix of every built-in impl on $DEVICE
#                                             (report in OUT/matrix)
#   tools/model_proof.sh audit OUT NAME       audit every report under OUT; keep the records as
#                                             OUT/NAME.jsonl.gz (for cases/records/) and print the
#                                             table and each fuzz run's last line
#
# The impls with entries: torch torch-checkpoint-wrapper torch-partial torch-sac-recompute
# torch-sac-titan torch-sac-save-rng torch-sac-save-first-rng torch-compile torch-compile-budget
# megatron megatron-graphsafe deepspeed transformer-engine remat remat-readme-hook and the neg-*
# controls (python -m harness list --impls).  torch-remat is not in the GPU image: carry its wheel
# (pure Python) and put it on PYTHONPATH first (README of the device tool, "wheels").
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
BUDGET=${BUDGET:-120}
PARALLEL=${PARALLEL:-8}
SEED0=${SEED0:-4001}
LIMIT=${LIMIT:-$((BUDGET * 2))}  # seconds a search may run in all, shrinking included

fuzz() {
    local out=$1; shift
    mkdir -p "$out"
    local seed=$SEED0 running=0
    for impl in "$@"; do
        # A search stops generating at its budget but finishes shrinking what it found: under load
        # that ran a 120 s search past 330 s (H100, 16 at once).  SIGTERM at LIMIT keeps its records.
        timeout "$LIMIT" "$PYTHON" -m harness fuzz --impl "$impl" --device "$DEVICE" --budget "$BUDGET" --new-only \
            --keep-going --no-database --seed "$seed" --report-dir "$out/f_$impl" --replace-report >"$out/$impl.log" 2>&1 &
        seed=$((seed + 1)); running=$((running + 1))
        if [ "$running" -ge "$PARALLEL" ]; then wait -n || true; running=$((running - 1)); fi
    done
    wait || true
    for impl in "$@"; do echo "$impl: $(tail -n 1 "$out/$impl.log")"; done
}

case "${1:-}" in
    fuzz) shift; [ $# -ge 2 ] || { echo "usage: $0 fuzz OUT IMPL..." >&2; exit 2; }; fuzz "$@" ;;
    matrix) [ $# -eq 2 ] || { echo "usage: $0 matrix OUT" >&2; exit 2; }
        "$PYTHON" -m harness run --impl all --device "$DEVICE" --report-dir "$2/matrix" --replace-report -q ;;
    audit) [ $# -eq 3 ] || { echo "usage: $0 audit OUT NAME" >&2; exit 2; }
        reports=()
        for dir in "$2"/f_* "$2"/matrix; do [ -f "$dir/results.jsonl" ] && reports+=("$dir"); done
        [ ${#reports[@]} -gt 0 ] || { echo "no report under $2" >&2; exit 2; }
        for log in "$2"/*.log; do [ -f "$log" ] && echo "$(basename "$log" .log): $(tail -n 1 "$log")"; done
        "$PYTHON" -m harness expectations audit "${reports[@]}" --examples --keep "$2/$3.jsonl.gz" ;;
    *) echo "usage: $0 fuzz OUT IMPL... | matrix OUT | audit OUT NAME" >&2; exit 2 ;;
esac
