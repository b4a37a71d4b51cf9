#!/usr/bin/env bash
# A/B of two configurations run at the same time, one core each, so that both see the same
# machine (this VM's speed drifts by ±6-30% between runs; pairs cancel most of it).
#
#   bench/ab_pair.sh STEPS ROUNDS CFG_A CFG_B
#
# CFG: "plain" or memplan-run settings, as bench/run_cfg.sh describes ("MEMPLAN_BUDGET=70%").
# TRAIN_ARGS (default "--model gpt2 --small --batch 1": a dispatch-bound step) go to
# examples/train.py; PYTHON defaults to python3; MEMPLAN_BUILD to build/. Prints, per round, the
# median step time of A and B (ms, steps after the warm-up) and B/A; sides swap cores each round.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-python3}
args=${TRAIN_ARGS:---model gpt2 --small --batch 1}
steps=$1 rounds=$2 cfg_a=$3 cfg_b=$4
work=$(mktemp -d)
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 MEMPLAN_SUMMARY=0 MEMPLAN_WARMUP=2

# shellcheck source=bench/run_cfg.sh
source "$root/bench/run_cfg.sh"
one() {  # CPU TAG CFG
  (cd "$work" && run_cfg "$3" "taskset -c $1" $args --steps "$steps" --times "$2.json" 2>"$2.err")
}

for r in $(seq "$rounds"); do
  if ((r % 2)); then one 0 a "$cfg_a" & one 1 b "$cfg_b" & else one 1 a "$cfg_a" & one 0 b "$cfg_b" & fi
  wait
  "$py" - "$work" <<'PY'
import json, statistics, sys
med = lambda f: statistics.median(json.load(open(f))[5:])
a, b = (med(f"{sys.argv[1]}/{s}.json") for s in "ab")
print(f"A {a * 1e3:.3f} ms  B {b * 1e3:.3f} ms  B/A x{b / a:.3f}")
PY
done
rm -rf "$work"
