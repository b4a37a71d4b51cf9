#!/usr/bin/env bash
# Prepares .gpu-deps/, the folder that tools/gpu_check.sh needs on the device machine (which has
# python3 + CUDA torch, nvcc, cmake and ninja, but no Debian packages: no fmt, nlohmann-json,
# CBC or pkg-config). Run once here, as root, in the checkout that the device tool sends:
#
#   tools/gpu_prepare.sh            # ~15 MiB in .gpu-deps/ (ignored through .git/info/exclude)
#   device run: bash tools/gpu_check.sh    with carry [".gpu-deps"]
#
# The .deb files are unpacked with dpkg -x into .gpu-deps/root (a sysroot: usr/include, usr/lib/
# x86_64-linux-gnu, ...), never into /. The device image is Ubuntu 24.04 (glibc 2.39); these
# Debian 12 libraries need glibc <= 2.36, so they load there. gpu_check.sh points CMake at the
# sysroot (CMAKE_PREFIX_PATH, PKG_CONFIG_SYSROOT_DIR) and the loader at its libraries.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps=${MEMPLAN_GPU_DEPS:-$root/.gpu-deps}
arch=x86_64-linux-gnu  # the device machine is x86-64 whatever this one is

pkgs=(
  libfmt-dev libfmt9 nlohmann-json3-dev                             # header-only / fmt
  coinor-libcbc-dev coinor-libcbc3 coinor-libcgl-dev coinor-libcgl1  # CBC and what it links
  coinor-libclp-dev coinor-libclp1 coinor-libosi-dev coinor-libosi1v5
  coinor-libcoinutils-dev coinor-libcoinutils3v5
  libblas-dev libblas3 liblapack-dev liblapack3 libgfortran5 libquadmath0
  libbz2-dev zlib1g-dev                                              # link-time .so names only
  pkgconf-bin libpkgconf3                                            # CMake's pkg_check_modules
)

say() { echo "[gpu_prepare] $*" >&2; }

if [[ $deps == "$root/.gpu-deps" ]] && ! grep -qx '/.gpu-deps/' "$root/.git/info/exclude" 2>/dev/null; then
  git_dir=$(git -C "$root" rev-parse --git-dir)
  [[ $git_dir = /* ]] || git_dir=$root/$git_dir
  mkdir -p "$git_dir/info"
  echo '/.gpu-deps/' >>"$git_dir/info/exclude"
fi

rm -rf "$deps"
mkdir -p "$deps/debs" "$deps/root"
o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64)
if ! (cd "$deps/debs" && apt-get "${o[@]}" download "${pkgs[@]}" >/dev/null 2>&1); then
  say "apt-get download failed; running apt-get update once"
  apt-get "${o[@]}" update -q >/dev/null
  (cd "$deps/debs" && apt-get "${o[@]}" download "${pkgs[@]}" >/dev/null)
fi
for f in "$deps"/debs/*.deb; do dpkg -x "$f" "$deps/root"; done
rm -rf "$deps/debs"

sysroot=$deps/root
lib=$sysroot/usr/lib/$arch
# Debian's alternatives (update-alternatives) would link libblas.so.3 etc. into lib/; dpkg -x
# does not run them.
for n in blas lapack; do
  for f in "$lib/$n"/lib$n.so*; do ln -sf "$n/$(basename "$f")" "$lib/$(basename "$f")"; done
done
# zlib and bzip2 are in every Ubuntu image (dpkg needs them): only their link-time names travel,
# as absolute links to the device's own runtime libraries.
for l in "$lib"/libz.so "$lib"/libbz2.so; do
  [[ -L $l ]] || continue
  ln -sf "/usr/lib/$arch/$(basename "$l").1$([[ $l == *bz2* ]] && echo .0)" "$l"
done
# Any other absolute link would point into the device's / : make them relative to the sysroot.
while IFS= read -r l; do
  t=$(readlink "$l")
  [[ $l == "$lib/libz.so" || $l == "$lib/libbz2.so" ]] && continue
  [[ -e $sysroot$t ]] && ln -sf "$(realpath --relative-to="$(dirname "$l")" "$sysroot$t")" "$l"
done < <(find "$sysroot" -type l -lname '/*')
# Static archives, docs and man pages: not needed, and they count against the 64 MiB carried.
find "$sysroot" -name '*.a' -delete
rm -rf "$sysroot/usr/share/doc" "$sysroot/usr/share/man" "$sysroot/usr/share/lintian"

say "ready: $(du -sh "$deps" | cut -f1) in $deps ($(find "$sysroot" -name '*.so*' | wc -l) shared objects)"
say "device run: bash tools/gpu_check.sh   with carry [\"${deps#"$root"/}\"]"
