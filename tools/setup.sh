#!/usr/bin/env bash
# One entry point for a fresh machine of this project's kind (run as root):
#   tools/setup.sh demo   install everything, build, run the demo training under memplan
#   tools/setup.sh test   install everything, build, run every test (ctest: GoogleTest + Python)
#   tools/setup.sh build  install everything and build only
# The virtualenv lives outside the checkout (MEMPLAN_VENV, default ~/.memplan-venv) so a fresh
# clone reuses it; the build goes to MEMPLAN_BUILD (default <checkout>/build).
# MEMPLAN_TORCH=cpu: the CPU-only torch 2.13.0 wheel instead (no torchvision, ~1 GB instead
# of ~5.5 GB; the CUDA parts are left out of the build), in ~/.memplan-venv-cpu by default.
set -euo pipefail
mode=${1:-build}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
say() { echo "[setup] $*" >&2; }
case ${MEMPLAN_TORCH:-cuda} in
  cuda) torch_req=(torch==2.14.1 torchvision==0.29.1); torch_version=2.14.1; imports="torch, torchvision, transformers, pytest"
        default_venv=$HOME/.memplan-venv ;;
  cpu) torch_req=(torch==2.13.0); torch_version=2.13.0; imports="torch, transformers, pytest"
       default_venv=$HOME/.memplan-venv-cpu ;;
  *) say "MEMPLAN_TORCH must be cuda (torch 2.14.1, the default) or cpu (torch 2.13.0)"; exit 2 ;;
esac
venv=${MEMPLAN_VENV:-$default_venv}
build=${MEMPLAN_BUILD:-$root/build}
apt_pkgs=(cmake ninja-build g++ pkg-config libgtest-dev libgmock-dev libfmt-dev nlohmann-json3-dev
          coinor-libcbc-dev)

install_apt() {
  local missing=()
  for p in "${apt_pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    say "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q "${missing[@]}" >/dev/null
  fi
}

install_venv() {
  local py=$venv/bin/python
  if [[ -x $py ]] && "$py" -c "import $imports, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
    return
  fi
  say "creating virtualenv $venv with ${torch_req[*]} (local wheels; several minutes the first time)"
  [[ -x $py ]] || python3 -m venv "$venv"
  # transformers: Hugging Face's own models in the zoo (examples/models.py HUGGINGFACE); pure
  # Python, it asks for no torch of its own.
  "$py" -m pip install -q --disable-pip-version-check "${torch_req[@]}" transformers==5.25.0 pytest numpy 2>&1 |
    grep -v "is ignored: it is neither" >&2 || true
  "$py" -c "import $imports" || { say "install failed ($imports)"; exit 1; }
}

configure_build() {
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEMPLAN_PYTHON="$venv/bin/python" >/dev/null
  cmake --build "$build" -j "$(nproc)"
}

install_apt
install_venv
configure_build

case "$mode" in
  build) ;;
  demo)
    shift || true
    cd "$root"
    MEMPLAN_BUILD="$build" exec "$venv/bin/python" "$root/tools/demo.py" "$@"
    ;;
  test)
    cd "$build"
    exec ctest --output-on-failure -j 2 --timeout 1500
    ;;
  *) say "usage: tools/setup.sh demo|test|build"; exit 2 ;;
esac
