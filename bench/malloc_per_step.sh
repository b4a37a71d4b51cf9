#!/usr/bin/env bash
# glibc malloc calls per training step of a configuration: two runs of it, SHORT and LONG steps,
# at the same time; (calls(LONG) - calls(SHORT)) / (LONG - SHORT) cancels start-up, warm-up and
# planning, leaving the steady per-step count. Deterministic enough to compare builds where
# wall-time A/Bs cannot see 1%.
#
#   bench/malloc_per_step.sh CFG [SHORT LONG]
#
# CFG as in bench/ab_pair.sh: "plain", or ';'-separated VAR=value settings for a memplan-run run
# (e.g. "MEMPLAN_BUDGET=70%;MEMPLAN_PLAN_CACHE=/tmp/pc" to replay one cached plan in both runs).
# TRAIN_ARGS (default "--model gpt2 --small --batch 1"), PYTHON, MEMPLAN_BUILD as there. Who
# allocates: run one configuration with MALLOC_COUNT_SAMPLE=64 MALLOC_COUNT_FROM=20
# MALLOC_COUNT_FOR=5 and MALLOC_COUNT_OUT set (bench/malloc_count.cpp).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
args=${TRAIN_ARGS:---model gpt2 --small --batch 1}
cfg=$1 short=${2:-1000} long=${3:-3000}
work=$(mktemp -d)
c++ -O2 -shared -fPIC -o "$work/malloc_count.so" "$root/bench/malloc_count.cpp" -ldl -lpthread
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 MEMPLAN_SUMMARY=0
# shellcheck source=bench/run_cfg.sh
source "$root/bench/run_cfg.sh"
one() {  # STEPS
  (cd "$work" && export MALLOC_COUNT_OUT="$work/calls-$1.txt" LD_PRELOAD="$work/malloc_count.so" &&
    run_cfg "$cfg" "" $args --steps "$1" 2>"$work/err-$1.txt")
}
one "$short" &
one "$long"
wait
a=$(awk '/^calls/ {print $2}' "$work/calls-$short.txt")
b=$(awk '/^calls/ {print $2}' "$work/calls-$long.txt")
echo "$cfg: $(( (b - a) / (long - short) )) malloc calls per step ($short and $long steps: $a, $b)"
rm -rf "$work"
