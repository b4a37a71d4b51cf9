#!/usr/bin/env bash
# The GPU check (design.md §9), one script for a lent device machine: builds the agent there
# against that machine's torch, runs a small GPT-like training under it (tests/gpu/
# profile_check.py, MEMPLAN_WARMUP=2) and prints, last, a table of per-op CUPTI vs CUDA-event
# times (top 10) and the agent's step peak vs torch.cuda.max_memory_allocated; then the replay
# benchmark of the GPT-2 demo on the device (issue 4's targets: overhead at 50% and 33%, peaks,
# bit-identical results), bench/replay_bench.py, budgets 100/50/33%; then the same at GPT-2-small
# width (device-bound, where the launch-bound demo is not), budgets 50/33%; then the demo with its
# MLPs on a side stream, at 50%.
#
# Prepare once here: tools/gpu_prepare.sh (fills the ignored .gpu-deps/: fmt, nlohmann-json,
# CBC, pkgconf unpacked from Debian packages). Then, as one device call:
#   run(command="bash tools/gpu_check.sh", carry=[".gpu-deps"], timeout_s=590)
# Budget: configure ~20 s, build ~1-3 min on 16 cores, run ~30 s, replay ~1-2 min, large replay
# ~1-2 min (skipped after 420 s); each phase has a timeout, and what is done lands in $OUT as it
# goes (build.log, run.log, profile.json, table.txt, trace.json, replay.txt, replay_large.txt,
# replay_side.txt).
#
# Read first when it runs (the CUDA paths have never run on a GPU; README "GPU"): the table's
# agent step peak against torch.cuda.max_memory_allocated (the tracker attaches at the first GPU
# step, from the bytes already held; 0 would mean it saw nothing), and the replay table's
# "identical" column (a dropout's re-run restores the CUDA generator).
#
# CPU fallbacks, to test the script without a GPU:
#   --cpu            run the model on the CPU (no GPU numbers; checks the run and the table)
#   --no-build DIR   use an existing build (e.g. /tmp/b0) instead of building
#   --configure-only stop after CMake found everything in .gpu-deps/
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps=${MEMPLAN_GPU_DEPS:-$root/.gpu-deps}
build=${MEMPLAN_GPU_BUILD:-/tmp/memplan-gpu-build}
out=${OUT:-/tmp/memplan-gpu-out}
py=${MEMPLAN_GPU_PYTHON:-$(command -v python3)}
# Read; not for the agent, which names every MEMPLAN_* variable it does not know.
unset MEMPLAN_GPU_DEPS MEMPLAN_GPU_BUILD MEMPLAN_GPU_PYTHON
device=cuda
do_build=1
configure_only=0
while (($#)); do
  case $1 in
    --cpu) device=cpu ;;
    --no-build) do_build=0; build=$(cd "$2" && pwd); shift ;;
    --configure-only) configure_only=1 ;;
    *) echo "usage: $0 [--cpu] [--no-build BUILD_DIR] [--configure-only]" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
phase=start
t0=$SECONDS
trap 'echo "gpu_check: FAILED in phase \"$phase\" after $((SECONDS - t0)) s (logs in $out)" >&2' ERR
step() { phase=$1; echo "== [$((SECONDS - t0)) s] $*"; }

step facts
nvidia-smi -L 2>/dev/null || echo "(no nvidia-smi)"
"$py" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__,
  "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
if [[ $device == cuda ]] && ! "$py" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())'; then
  echo "gpu_check: torch sees no CUDA device (use --cpu to test the script without one)" >&2
  exit 1
fi

# Carried dependencies: a sysroot made by tools/gpu_prepare.sh.
sysroot=$deps/root
lib=$sysroot/usr/lib/x86_64-linux-gnu
runtime_libs=$lib:$lib/blas:$lib/lapack

if ((do_build)); then
  step configure
  if [[ ! -d $lib ]]; then
    echo "gpu_check: $deps missing: run tools/gpu_prepare.sh here and carry .gpu-deps" >&2
    exit 1
  fi
  pyinc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  if [[ ! -f $pyinc/Python.h ]]; then
    echo "gpu_check: $pyinc/Python.h missing: the agent's Python module cannot be built here" >&2
    exit 1
  fi
  mkdir -p "$build"
  # pkgconf from the sysroot, told to prefix the .pc files' /usr paths with the sysroot.
  cat >"$build/pkg-config" <<EOF
#!/bin/sh
export LD_LIBRARY_PATH="$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PKG_CONFIG_SYSROOT_DIR="$sysroot" PKG_CONFIG_LIBDIR="$lib/pkgconfig:$sysroot/usr/share/pkgconfig"
exec "$sysroot/usr/bin/pkgconf" "\$@"
EOF
  chmod +x "$build/pkg-config"
  gen=("Unix Makefiles")
  command -v ninja >/dev/null && gen=(Ninja)
  if ! timeout 120 cmake -S "$root" -B "$build" -G "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DMEMPLAN_PYTHON="$py" -DMEMPLAN_BUILD_TESTS=OFF -DMEMPLAN_WITH_CUDA=ON \
    -DCMAKE_PREFIX_PATH="$sysroot/usr" -Dfmt_DIR="$lib/cmake/fmt" \
    -Dnlohmann_json_DIR="$sysroot/usr/share/cmake/nlohmann_json" \
    -DPKG_CONFIG_EXECUTABLE="$build/pkg-config" >"$out/configure.log" 2>&1; then
    tail -40 "$out/configure.log"
    false
  fi
  grep -E "memplan:|Found cbc|Found fmt|Found nlohmann" "$out/configure.log" || true
  ((configure_only)) && { echo "gpu_check: configured in $build"; exit 0; }

  step build
  # Only the agent (libmemplan.so + the Python module), not the planner tools.
  timeout 240 cmake --build "$build" --target memplan -j "$(nproc)" >"$out/build.log" 2>&1 ||
    { tail -30 "$out/build.log"; false; }
  echo "built $(ls "$build"/boot/_memplan*.so)"
fi

step run
export LD_LIBRARY_PATH="$runtime_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
rm -f "$out/profile.json"
MEMPLAN_BUILD="$build" MEMPLAN_WARMUP=2 MEMPLAN_PROFILE_OUT="$out/profile.json" MEMPLAN_TRACE="$out/trace.json" \
  MEMPLAN_LOG=info \
  PYTHONUNBUFFERED=1 timeout 150 "$root/tools/memplan-run" "$py" "$root/tests/gpu/profile_check.py" \
  --device "$device" 2>&1 | tee "$out/run.log"
if [[ ! -s $out/profile.json ]]; then
  echo "gpu_check: the agent wrote no profile (did it load? see run.log)" >&2
  false
fi

step table
echo
echo "================ memplan GPU check ($device, $((SECONDS - t0)) s) ================"
"$py" "$root/tests/gpu/profile_table.py" "$out/profile.json" "$out/run.log" --top 10 | tee "$out/table.txt"

step replay
# Plain vs MEMPLAN_BUDGET on the same device, interleaved; a failure here keeps the table above.
echo
echo "================ memplan replay ($device): GPT-2 demo, batch 32 ================"
MEMPLAN_BUILD="$build" timeout 200 "$py" "$root/bench/replay_bench.py" --models gpt2 --steps 12 \
  --budgets 100%,50%,33% --train-args "--device $device --batch 32" 2>&1 | tee "$out/replay.txt" ||
  echo "gpu_check: the replay benchmark failed (see $out/replay.txt)"

step replay-large
# The same model at GPT-2-small width (768, 12 heads, 8 blocks, 256 tokens, batch 16): on the
# GPU its kernels, not its launches, take the step's time, as in a model that does not fit. The
# batch-32 demo above is launch-bound there (kernels of a few microseconds), so its overhead is
# mostly the host's. Skipped when the call's time is nearly spent; on the CPU, a smaller size.
large="--width 768 --layers 8 --seq 256 --batch 16"
[[ $device == cpu ]] && large="--width 256 --layers 2 --seq 128 --batch 8"
if ((SECONDS - t0 < 420)); then
  echo
  echo "================ memplan replay ($device): GPT-2 demo, $large ================"
  MEMPLAN_BUILD="$build" timeout 150 "$py" "$root/bench/replay_bench.py" --models gpt2 --steps 10 \
    --budgets 50%,33% --train-args "--device $device $large" 2>&1 | tee "$out/replay_large.txt" ||
    echo "gpu_check: the large replay benchmark failed (see $out/replay_large.txt)"
else
  echo "gpu_check: $((SECONDS - t0)) s spent, the large replay is skipped"
fi

step side-stream
# The demo with each block's MLP on a side stream (train.py --side-stream): memplan re-runs no op
# there and evicts nothing such an op reads (rerun_handle.h side_stream_of); read the
# "identical" column. Skipped when the call's time is nearly spent, and on the CPU (no streams).
if [[ $device == cuda ]] && ((SECONDS - t0 < 500)); then
  echo
  echo "================ memplan replay ($device): GPT-2 demo, batch 32, MLPs on a side stream ================"
  MEMPLAN_BUILD="$build" timeout 80 "$py" "$root/bench/replay_bench.py" --models gpt2 --steps 8 \
    --budgets 50% --train-args "--device $device --batch 32 --side-stream" 2>&1 | tee "$out/replay_side.txt" ||
    echo "gpu_check: the side-stream replay failed (see $out/replay_side.txt)"
else
  echo "gpu_check: the side-stream replay is skipped ($device, $((SECONDS - t0)) s spent)"
fi
