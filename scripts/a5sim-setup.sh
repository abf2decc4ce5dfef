#!/usr/bin/env bash
# Build the a5 CPU simulator toolchain (pypto + its runtime, pto-isa, the PTO assembler) from checkouts the user
# provides, in a Debian sid chroot that has g++ >= 13 (std::bfloat16_t) and LLVM/MLIR 21. Idempotent: each stage
# leaves a stamp and is skipped when its inputs have not changed; --force STAGE redoes one. Every stage's time is
# printed and appended to PREFIX/times.log. Nothing is cloned: the sources are the user's checkouts; system
# packages come from Debian's registry (debootstrap / apt) and Python packages from pip's configured index.
#
#   bash scripts/a5sim-setup.sh --sources DIR [--prefix DIR] [--jobs N] [--stage NAME] [--force NAME]
#
# DIR holds (or symlinks) the checkouts: pypto, simpler (pypto's runtime), pto-isa, PTOAS, libbacktrace,
# msgpack-c. See docs/a5sim.md for the commits known to work together. Needs root (debootstrap, bind mounts).
set -euo pipefail

PREFIX="${A5SIM_PREFIX:-/opt/pto-a5sim}"
SOURCES=""
JOBS=2
ONLY=""
FORCE=""
MIRROR="${A5SIM_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
STAGES=(chroot packages)

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
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
    g++-15 cmake ninja-build git ca-certificates ccache python3 python3-dev python3-venv pybind11-dev zlib1g-dev \
    libzstd-dev libmlir-21-dev libmlir-21 mlir-21-tools llvm-21-dev llvm-21-tools
  # Debian's libMLIR package lacks the versioned symlink the CMake config names
  local lib="$ROOTFS/usr/lib/llvm-21/lib"
  if [ -e "$lib/libMLIR.so.21.1" ] || [ ! -e "$lib/libMLIR.so" ]; then :; else ln -s libMLIR.so "$lib/libMLIR.so.21.1"; fi
}

for s in "${STAGES[@]}"; do stage "$s"; done
