#!/usr/bin/env bash
# Build the a5 CPU simulator toolchain (pypto + its runtime, pto-isa, the PTO assembler) from checkouts the user
# provides, in a Debian sid chroot that has g++ >= 13 (std::bfloat16_t) and LLVM/MLIR 21. Idempotent: each stage
# leaves a stamp and is skipped when its inputs have not changed; --force STAGE redoes one. Every stage's time is
# printed and appended to PREFIX/times.log. Nothing comes from the network but Debian's registry (debootstrap /
# apt) and pip's configured index: the sources are the user's checkouts, cloned locally into PREFIX/src.
#
#   bash scripts/a5sim-setup.sh --sources DIR [--prefix DIR] [--jobs N] [--stage NAME] [--force NAME]
#
# DIR holds (or symlinks) the checkouts: pypto, simpler (pypto's runtime), pto-isa, PTOAS, libbacktrace,
# msgpack-c, and pypto-lib (its hello_world example runs last); the commits known to work together are pinned
# below (PIN_*). The result: PREFIX/bin/python, the toolchain's Python in its chroot; pto-contracts' upstream
# worker uses it with PTO_UPSTREAM_PYTHON=PREFIX/bin/python (goldens doctor checks each piece).
# Needs root (debootstrap, bind mounts).
set -euo pipefail

PREFIX="${A5SIM_PREFIX:-/opt/pto-a5sim}"
SOURCES=""
JOBS=2
ONLY=""
FORCE=""
MIRROR="${A5SIM_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
STAGES=(chroot packages venv sources pypto runtime simfix ptoas wrapper example)
# Commits known to work together (docs/a5sim.md); a checkout at another commit is used as it is, with a warning.
PIN_PYPTO=e2d0f78a
PIN_SIMPLER=93adc386
PIN_PTO_ISA=cd4a3d3f
# PTOAS: the v0.57 version bump (pypto's toolchain/versions.env pins ptoas v0.57). Later commits (596559c6, Aug 10)
# refuse pypto's tsort32 without an explicit tmp at --pto-level=level3, which V4-Pro's gate.py needs
PIN_PTOAS=d9705519

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "a5sim-setup: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --sources) SOURCES="${2:?}"; shift 2 ;;
    --prefix) PREFIX="${2:?}"; shift 2 ;;
    --jobs) JOBS="${2:?}"; shift 2 ;;
    --stage) ONLY="${2:?}"; shift 2 ;;
    --force) FORCE="${2:?}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[ "$(id -u)" = 0 ] || die "needs root (debootstrap and bind mounts)"
ROOTFS="$PREFIX/chroot"
STAMPS="$PREFIX/stamps"
mkdir -p "$STAMPS"

stage() {  # stage NAME: run stage_NAME unless stamped (or not the one asked for), timing it
  local name="$1" t0
  if [ -n "$ONLY" ] && [ "$ONLY" != "$name" ]; then return 0; fi
  if [ -f "$STAMPS/$name" ] && [ "$FORCE" != "$name" ]; then echo "[$name] done before ($(cat "$STAMPS/$name"))"; return 0; fi
  echo "[$name] starting $(date -u +%FT%TZ)"
  t0=$(date +%s)
  "stage_$name"
  local took=$(( $(date +%s) - t0 ))
  echo "$(date -u +%FT%TZ) ${took}s" > "$STAMPS/$name"
  echo "$name ${took}s $(date -u +%FT%TZ)" >> "$PREFIX/times.log"
  echo "[$name] done in ${took}s"
}

stage_chroot() {
  command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install debootstrap"
  if [ ! -x "$ROOTFS/usr/bin/apt-get" ]; then
    debootstrap --variant=minbase sid "$ROOTFS" "$MIRROR"
  fi
}

stage_packages() {
  # a mirror snapshot's Release file may be older than its validity window: accept it (the signature still counts)
  chroot "$ROOTFS" /usr/bin/env DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::Check-Valid-Until=false update -q
  chroot "$ROOTFS" /usr/bin/env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    g++-15 g++ make cmake ninja-build git ca-certificates ccache python3 python3-dev python3-venv pybind11-dev zlib1g-dev \
    libzstd-dev libmlir-21-dev libmlir-21 mlir-21-tools llvm-21-dev llvm-21-tools
  mlir_symlink
}

mlir_symlink() {
  # Debian's libMLIR package lacks the versioned link under llvm-21/lib that its CMake config names (libMLIR.so
  # there points at it, dangling); the library itself is in the multiarch folder
  local lib="$ROOTFS/usr/lib/llvm-21/lib"
  [ -e "$lib/libMLIR.so.21.1" ] || ln -sf ../../x86_64-linux-gnu/libMLIR.so.21.1 "$lib/libMLIR.so.21.1"
}

HOST_PY="${A5SIM_PYTHON:-$(python3 -c 'import sys; print(sys.base_prefix)' 2>/dev/null)/bin/python3}"
VENV="$PREFIX/venv"
SRC="$PREFIX/src"

mounts() {  # the host paths the chroot needs, at the same absolute paths (idempotent)
  local p
  for p in /proc /sys /dev /dev/pts "$(dirname "$(dirname "$(readlink -f "$HOST_PY")")")" "$PREFIX" "$SOURCES" \
           "${CCACHE_DIR:-$HOME/.ccache}"; do
    [ -n "$p" ] && [ -e "$p" ] || continue
    mkdir -p "$ROOTFS$p"
    mountpoint -q "$ROOTFS$p" || mount --bind "$p" "$ROOTFS$p"
  done
}

in_chroot() {  # run a command inside the chroot, with the toolchain's compilers and ccache
  mounts
  chroot "$ROOTFS" /usr/bin/env -i HOME=/root PATH="$VENV/bin:/usr/lib/llvm-21/bin:/usr/bin:/bin" \
    CC=gcc-15 CXX=g++-15 CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache \
    CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" MAX_JOBS="$JOBS" \
    CCACHE_DIR="${CCACHE_DIR:-$HOME/.ccache}" LANG=C.UTF-8 "$@"
}

stage_venv() {
  [ -x "$HOST_PY" ] || die "no host Python at $HOST_PY (set A5SIM_PYTHON to the python the project's venv uses)"
  [ -x "$VENV/bin/python" ] || "$HOST_PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "torch==2.13.0"  # the CPU wheel, from pip's configured index (no CUDA download)
  "$VENV/bin/pip" install -q "scikit-build-core>=0.10" "nanobind>=2,<3" cmake ninja "numpy>=2" cloudpickle pytest \
    pytest-timeout PyYAML
}

checkout_at() {  # checkout_at NAME PIN: clone the user's checkout into PREFIX/src (no network), at PIN when present
  local name="$1" pin="$2"
  [ -d "$SOURCES/$name/.git" ] || die "missing checkout $SOURCES/$name (see --help)"
  [ -d "$SRC/$name/.git" ] || git clone -q "$SOURCES/$name" "$SRC/$name"
  if git -C "$SRC/$name" cat-file -e "$pin^{commit}" 2>/dev/null; then
    git -C "$SRC/$name" checkout -q "$pin"
  else
    echo "warning: $name has no commit $pin; building $(git -C "$SRC/$name" rev-parse --short HEAD) as checked out"
  fi
}

stage_sources() {
  [ -n "$SOURCES" ] || die "--sources DIR is required (the directory holding the upstream checkouts)"
  SOURCES="$(readlink -f "$SOURCES")"
  mkdir -p "$SRC"
  checkout_at pypto "$PIN_PYPTO"
  checkout_at pto-isa "$PIN_PTO_ISA"
  checkout_at PTOAS "$PIN_PTOAS"
  # pypto's submodules from the local checkouts (the pinned libbacktrace / msgpack-c commits are not in every
  # snapshot: their default branches work)
  local sub
  git -C "$SRC/pypto" config submodule.runtime.url "$SOURCES/simpler"
  git -C "$SRC/pypto" config submodule.3rdparty/libbacktrace.url "$SOURCES/libbacktrace"
  git -C "$SRC/pypto" config submodule.3rdparty/msgpack-c.url "$SOURCES/msgpack-c"
  for sub in runtime 3rdparty/libbacktrace 3rdparty/msgpack-c; do
    local url want; url="$(git -C "$SRC/pypto" config "submodule.$sub.url")"
    want="$(git -C "$SRC/pypto" ls-tree HEAD "$sub" | awk '{print $3}')"
    if [ "$(git -C "$SRC/pypto/$sub" rev-parse HEAD 2>/dev/null)" = "$want" ]; then continue; fi
    rm -rf "${SRC:?}/pypto/$sub"; git clone -q "$url" "$SRC/pypto/$sub"
    if git -C "$SRC/pypto/$sub" cat-file -e "$want^{commit}" 2>/dev/null; then
      git -C "$SRC/pypto/$sub" checkout -q "$want"
    elif [ "$sub" = 3rdparty/msgpack-c ]; then  # the pinned commit is not in every snapshot: cpp_master works
      # (the C++ line: a local branch of the user's checkout, or its remote-tracking one)
      git -C "$SRC/pypto/$sub" fetch -q "$url" refs/heads/cpp_master:refs/heads/cpp_master 2>/dev/null ||
        git -C "$SRC/pypto/$sub" fetch -q "$url" refs/remotes/origin/cpp_master:refs/heads/cpp_master
      git -C "$SRC/pypto/$sub" checkout -q cpp_master
      echo "warning: $sub has no commit $want; using cpp_master $(git -C "$SRC/pypto/$sub" rev-parse --short HEAD)"
    else
      echo "warning: $sub has no commit $want; using $(git -C "$SRC/pypto/$sub" rev-parse --short HEAD)"
    fi
  done
  # the runtime clones pto-isa on first use: put the pinned one where it looks
  mkdir -p "$SRC/pypto/runtime/build"
  [ -d "$SRC/pypto/runtime/build/pto-isa" ] || git clone -q "$SRC/pto-isa" "$SRC/pypto/runtime/build/pto-isa"
}

stage_pypto() {
  in_chroot /bin/sh -c "cd '$SRC/pypto' && '$VENV/bin/pip' install --no-build-isolation -v . > '$PREFIX/pypto-build.log' 2>&1" \
    || die "pypto build failed: see $PREFIX/pypto-build.log"
}

stage_runtime() {
  # pypto's runtime ("simpler") with its a5sim runtimes, then pto-isa at the pinned commit in the installed
  # runtime's own asset folder (kernels stop with "PTO-ISA not available" otherwise)
  in_chroot /bin/sh -c "cd '$SRC/pypto' && '$VENV/bin/pip' install --no-build-isolation -v ./runtime \
    > '$PREFIX/runtime-build.log' 2>&1" || die "runtime build failed: see $PREFIX/runtime-build.log"
  local assets
  assets="$("$VENV/bin/python" -c 'import os, simpler_setup; print(os.path.dirname(simpler_setup.__file__))')/_assets/build"
  mkdir -p "$assets"
  [ -d "$assets/pto-isa/.git" ] || git clone -q "$SRC/pto-isa" "$assets/pto-isa"
  git -C "$assets/pto-isa" checkout -q "$PIN_PTO_ISA" 2>/dev/null || echo "warning: pto-isa has no commit $PIN_PTO_ISA"
  rm -f "$STAMPS/simfix"  # the simulator fix is applied on top of this checkout: redo it
}

stage_simfix() {
  # pto-isa's CPU simulator (the runtime's pin cd4a3d3f, and every commit since 439faf48) adds tiles of one C++
  # type only, while the V4-Pro kernels' generated code adds INT32 tiles whose valid shape is static on one
  # operand and dynamic on another: the gate, the compressors, the indexers and the attention kernels stop in g++
  # ("no matching function for call to TADD_IMPL"). This adds a TADD over such tiles (same element type, storage
  # shape and layout; valid shapes checked equal at run time) to the toolchain's copy of pto-isa -- never your
  # checkout --, commits it there and points the installed runtime's pin at that commit (the runtime takes only a
  # pristine checkout at its pin).
  local assets hdr
  assets="$("$VENV/bin/python" -c 'import os, simpler_setup; print(os.path.dirname(simpler_setup.__file__))')/_assets"
  [ -d "$assets/build/pto-isa/.git" ] || die "no pto-isa in the runtime's assets: redo the runtime stage"
  git -C "$assets/build/pto-isa" reset -q --hard "$PIN_PTO_ISA"
  hdr="$assets/build/pto-isa/include/pto/cpu/TAdd.hpp"
  "$HOST_PY" - "$hdr" <<'PY' || die "could not add the mixed-tile TADD to $hdr"
import sys
path = sys.argv[1]
text = open(path).read()
marker = "PTO_INTERNAL void TADD_IMPL(tile_shape& dst, tile_shape& src0, tile_shape& src1)"
if marker not in text:
    sys.exit(f"{path}: the one-type TADD_IMPL is not where it was; this pto-isa may not need the fix")
end = text.index("\n}\n", text.index(marker)) + 3
overload = """
// pto-contracts a5sim-setup: TADD over tiles that differ only in how their valid shape is given.
template <typename D, typename S0, typename S1>
    requires(!(std::is_same_v<D, S0> && std::is_same_v<D, S1>))
PTO_INTERNAL void TADD_IMPL(D& dst, S0& src0, S1& src1)
{
    static_assert(std::is_same_v<typename D::DType, typename S0::DType> &&
                  std::is_same_v<typename D::DType, typename S1::DType>, "TADD: one element type");
    static_assert(D::Rows == S0::Rows && D::Rows == S1::Rows && D::Cols == S0::Cols && D::Cols == S1::Cols &&
                  D::isRowMajor == S0::isRowMajor && D::isRowMajor == S1::isRowMajor &&
                  D::SFractal == S0::SFractal && D::SFractal == S1::SFractal, "TADD: one storage shape and layout");
    unsigned row = dst.GetValidRow();
    unsigned col = dst.GetValidCol();
    PTO_ASSERT(src0.GetValidRow() == row && src0.GetValidCol() == col, "TADD: src0 valid shape differs from dst");
    PTO_ASSERT(src1.GetValidRow() == row && src1.GetValidCol() == col, "TADD: src1 valid shape differs from dst");
    TAdd_Impl<D>(dst.data(), src0.data(), src1.data(), row, col);
}
"""
text = text[:end] + overload + text[end:]
if "#include <type_traits>" not in text:
    text = text.replace("#include <pto/common/pto_tile.hpp>", "#include <pto/common/pto_tile.hpp>\n#include <type_traits>", 1)
open(path, "w").write(text)
PY
  git -C "$assets/build/pto-isa" -c user.name=a5sim-setup -c user.email=a5sim-setup@localhost commit -qam \
    "pto-contracts a5sim-setup: TADD over tiles of static and dynamic valid shapes (CPU simulator)"
  git -C "$assets/build/pto-isa" rev-parse HEAD > "$assets/pto_isa.pin"
}

stage_ptoas() {
  # The PTO assembler as a plain command. Debian builds no MLIR Python bindings, and the pinned ptoas command is a
  # Python extension: build PTOAS's libraries with the bindings off and a small executable whose main calls
  # mlir::pto::runPTOAS, linked against Debian's shared libMLIR / libLLVM only (the static component archives
  # register LLVM's options twice). Two spots in the device (LLVM IR) back end use types and a calling convention
  # that only upstream's LLVM fork has; neither is on the simulator path: the low-precision float types are lowered
  # as i8 and the SIMT entry convention as C, in the build copy (PREFIX/src/PTOAS), never in the user's checkout.
  local src="$SRC/PTOAS" build="$PREFIX/build-ptoas" t
  mlir_symlink
  # the build copy is ours: back to the pin, clean, before the edits below
  git -C "$src" reset -q --hard && git -C "$src" clean -fdq
  git -C "$src" checkout -q "$PIN_PTOAS" 2>/dev/null || echo "warning: PTOAS has no commit $PIN_PTOAS; building as checked out"
  for t in LLVMHiFloat8Type LLVMFloat8E4M3Type LLVMFloat8E5M2Type LLVMFloat4E1M2x2Type LLVMFloat4E2M1x2Type; do
    { grep -rl "LLVM::$t" "$src/lib" "$src/tools" 2>/dev/null || true; } | while read -r f; do
      perl -0pi -e "s/isa<LLVM::LLVMHiFloat8Type,[^>]*>\(type\)/false/g; s/LLVM::$t::get\(([^()]*(?:\([^()]*\))?)\)/IntegerType::get(\1, 8)/g" "$f"
    done
  done
  { grep -rl "CallingConv::SimtEntry" "$src/lib" "$src/tools" 2>/dev/null || true; } | xargs -r sed -i 's/CallingConv::SimtEntry/CallingConv::C/g'
  # the driver's own sources, as its CMakeLists lists them at this commit (the list grows: d9705519 added the
  # Tilelang daemon), plus the SIMT size patcher it links as a library
  local drv
  drv=$(awk '/set\(PTOAS_RUNTIME_SOURCES/{p=1; next} p && /\)/{p=0} p {print $1}' "$src/tools/ptoas/CMakeLists.txt" \
        | sed 's|^|"${_drv}/|; s|$|"|' | tr '\n' ' ')
  [ -n "$drv" ] || drv='"${_drv}/ptoas.cpp" "${_drv}/driver.cpp" "${_drv}/VPTOHostStubEmission.cpp" "${_drv}/ObjectEmission.cpp"'
  if [ -f "$src/tools/ptoas/VFSIMTSizePatcher.cpp" ]; then drv="$drv \"\${_drv}/VFSIMTSizePatcher.cpp\""; fi
  mkdir -p "$src/tools/ptoas-cli"
  cat > "$src/tools/ptoas-cli/main.cpp" <<'CPP'
// pto-contracts a5sim-setup: the PTO assembler as a plain command (the driver is PTOAS's own).
#include "ptoas.h"
int main(int argc, char **argv) { return mlir::pto::runPTOAS(argc, argv); }
CPP
  cat > "$src/tools/ptoas-cli/CMakeLists.txt" <<'CMAKE'
# pto-contracts a5sim-setup: PTOAS's driver sources and library objects, linked against the shared libMLIR / libLLVM
set(_drv "${CMAKE_SOURCE_DIR}/tools/ptoas")
add_executable(ptoas-cli main.cpp @DRIVER_SOURCES@
  $<TARGET_OBJECTS:obj.PTOIR> $<TARGET_OBJECTS:obj.PTOTransforms> $<TARGET_OBJECTS:obj.ptobc_lib>)
set_target_properties(ptoas-cli PROPERTIES OUTPUT_NAME ptoas RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/bin")
target_compile_definitions(ptoas-cli PRIVATE PTOAS_RELEASE_VERSION="${PTOAS_CLI_VERSION}"
  PTOAS_COMPILER_BUILDING_LIBRARY=1)
add_dependencies(ptoas-cli PTOOpsIncGen PTOPassesIncGen)
target_include_directories(ptoas-cli PRIVATE "${_drv}" "${CMAKE_SOURCE_DIR}/tools/ptobc/include"
  "${CMAKE_SOURCE_DIR}/tools/ptobc/generated")
target_link_libraries(ptoas-cli PRIVATE "${LLVM_LIBRARY_DIR}/libMLIR.so" "${LLVM_LIBRARY_DIR}/libLLVM.so")
CMAKE
  DRV="$drv" perl -pi -e 's/\@DRIVER_SOURCES\@/$ENV{DRV}/' "$src/tools/ptoas-cli/CMakeLists.txt"
  sed -i 's/^add_subdirectory(ptoas)$/add_subdirectory(ptoas-cli)/; s/^add_subdirectory(pto-test-opt)$//' \
    "$src/tools/CMakeLists.txt"
  in_chroot /bin/sh -c "cmake -S '$src' -B '$build' -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE=-O1 \
      -DLLVM_DIR=/usr/lib/llvm-21/lib/cmake/llvm -DMLIR_DIR=/usr/lib/llvm-21/lib/cmake/mlir \
      -DPTO_ENABLE_PYTHON_BINDING=OFF -DPTOAS_ENABLE_WERROR=OFF -DBUILD_TESTING=OFF \
      -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
      -DCMAKE_C_COMPILER=gcc-15 -DCMAKE_CXX_COMPILER=g++-15 > '$PREFIX/ptoas-build.log' 2>&1 \
    && ninja -C '$build' -j '$JOBS' ptoas-cli >> '$PREFIX/ptoas-build.log' 2>&1" \
    || die "PTOAS build failed: see $PREFIX/ptoas-build.log"
  mkdir -p "$PREFIX/ptoas/bin"
  cp "$build/bin/ptoas" "$PREFIX/ptoas/bin/ptoas"
  in_chroot "$PREFIX/ptoas/bin/ptoas" --version > /dev/null 2>&1 || die "the built ptoas does not run: see $PREFIX/ptoas-build.log"
}

stage_wrapper() {
  # PREFIX/bin/python: the toolchain's Python inside the chroot, for pto-contracts' upstream worker
  # (PTO_UPSTREAM_PYTHON=PREFIX/bin/python) and for running upstream's examples. It bind-mounts the working folder,
  # every existing absolute path among its arguments and PYTHONPATH, and passes the PTO* / PYPTO* / OMP_* settings.
  mkdir -p "$PREFIX/bin"
  cat > "$PREFIX/bin/python" <<WRAP
#!/bin/sh
# Written by pto-contracts scripts/a5sim-setup.sh: the a5sim toolchain's Python, run inside its chroot (needs root).
ROOTFS='$ROOTFS'
mount_in() {
  p="\$1"; [ -d "\$p" ] || p="\$(dirname "\$p")"
  case "\$p" in /|/proc*|/sys*|/dev*) return 0 ;; esac
  mkdir -p "\$ROOTFS\$p" && { mountpoint -q "\$ROOTFS\$p" || mount --bind "\$p" "\$ROOTFS\$p"; }
}
for p in "\$PWD" \$(echo "\$PYTHONPATH" | tr ':' ' ') "\$@"; do
  case "\$p" in /*) [ -e "\$p" ] && mount_in "\$p" ;; esac
done
for p in /proc /sys /dev /dev/pts '$(dirname "$(dirname "$(readlink -f "$HOST_PY")")")' '$PREFIX'; do
  mountpoint -q "\$ROOTFS\$p" || { mkdir -p "\$ROOTFS\$p"; mount --bind "\$p" "\$ROOTFS\$p"; }
done
pass=\$(env | grep -E '^(PTO|PYPTO|OMP_|DEEPSEEK_V4_VARIANT=|PYTHONPATH=|TMPDIR=)' | tr '\n' '\001')
IFS=\$(printf '\001')
exec chroot "\$ROOTFS" /usr/bin/env -i HOME=/root LANG=C.UTF-8 PATH='$VENV/bin:/usr/lib/llvm-21/bin:/usr/bin:/bin' \\
  PTOAS_ROOT='$PREFIX/ptoas/bin' A5SIM_COMMITS='$PREFIX/commits.txt' \$pass /bin/sh -c 'cd "\$0" && exec "\$@"' "\$PWD" '$VENV/bin/python' "\$@"
WRAP
  chmod +x "$PREFIX/bin/python"
  "$PREFIX/bin/python" -c 'import pypto.language, simpler_setup; print("pypto and its runtime import")' \
    || die "the toolchain's Python does not import pypto (see $PREFIX/pypto-build.log)"
}

stage_example() {
  # one upstream example on a5sim, from the user's pypto-lib checkout
  local lib="$SOURCES/pypto-lib"
  [ -f "$lib/examples/beginner/hello_world.py" ] \
    || die "no pypto-lib checkout with examples/beginner/hello_world.py at $lib (put one in --sources)"
  lib="$(readlink -f "$lib")"
  (cd "$lib" && PYTHONPATH="$lib" "$PREFIX/bin/python" "$lib/examples/beginner/hello_world.py" -p a5sim) \
    > "$PREFIX/example.log" 2>&1 || die "hello_world.py -p a5sim failed: see $PREFIX/example.log"
  tail -n 3 "$PREFIX/example.log"
}

record_commits() {
  # what the toolchain was built from, for the provenance of kept device runs: rewritten after every run, so a
  # stage redone with --force (a new assembler) is what the wrapper reports
  local name
  [ -d "$SRC" ] || return 0
  local sim
  for name in pypto pypto/runtime pto-isa PTOAS; do
    if [ -d "$SRC/$name" ]; then echo "$name $(git -C "$SRC/$name" rev-parse --short=12 HEAD)"; fi
  done > "$PREFIX/commits.txt"
  sim="$("$VENV/bin/python" -c 'import os, simpler_setup; print(os.path.dirname(simpler_setup.__file__))' 2>/dev/null)/_assets/build/pto-isa"
  if [ -d "$sim/.git" ]; then  # what the simulator compiles kernels with (pto-isa plus the simfix commit)
    echo "pto-isa-sim $(git -C "$sim" rev-parse --short=12 HEAD) ($(git -C "$sim" log -1 --format=%s | cut -c1-60))" \
      >> "$PREFIX/commits.txt"
  fi
}

SOURCES="${SOURCES:+$(readlink -f "$SOURCES")}"
for s in "${STAGES[@]}"; do stage "$s"; done
record_commits
