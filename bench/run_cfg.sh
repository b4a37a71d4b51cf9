# Sourced by the bench scripts (ab_pair.sh, malloc_per_step.sh): one way to start a configuration.
#
#   run_cfg CFG WRAP TRAIN_ARGS...
#
# Runs examples/train.py TRAIN_ARGS in the current directory, stdout to /dev/null, under CFG:
# "plain" (no memplan) or ';'-separated VAR=value settings for a tools/memplan-run run, e.g.
# "MEMPLAN_BUDGET=70%" or "MEMPLAN_PLAN=/tmp/p50.json;MEMPLAN_BUILD=/tmp/old-build". WRAP is a
# command prefix, split into words ("taskset -c 0"; "" for none). PYTHON (default python3) and
# MEMPLAN_BUILD (default build/; a CFG setting wins) are read from the environment, as is
# anything the caller exports (LD_PRELOAD: memplan-run puts libmemplan.so before it).
run_cfg_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

run_cfg() {
  local cfg=$1 wrap=$2
  shift 2
  local py=${PYTHON:-python3} train=$run_cfg_root/examples/train.py
  if [[ $cfg == plain ]]; then
    $wrap "$py" "$train" "$@" >/dev/null
  else
    local kv
    IFS=';' read -r -a kv <<<"$cfg"
    env MEMPLAN_BUILD="${MEMPLAN_BUILD:-$run_cfg_root/build}" "${kv[@]}" $wrap "$run_cfg_root/tools/memplan-run" \
      "$py" "$train" "$@" >/dev/null
  fi
}
