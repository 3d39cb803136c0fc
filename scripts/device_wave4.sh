#!/usr/bin/env bash
# device_wave4.sh: issue 23 on a lent GPU host in one device call (outputs under $OUT); parts in the order given
# (default: warm nvitop release):
#
#   warm      item 3: profiles/gpu-hog-warm.toml (scripts/gpu_hog.py as a weight cache daemon holding 4 GiB and its
#             engine holding $ENGINE_MIB) through the CLI: launch -> both roles on NVML's process list (and named
#             by `tunedash free`) -> kill the engine: WARM with the daemon's MiB -> relaunch keeps the daemon ->
#             kill --all: FREE at 0 MiB; NVML's own view after each step (scripts/nvml_holders.py)
#   release   item 1: bench/bench_release.py --rounds 5 --mib 16384 --sources nvml,smi
#   nvitop    item 2: bench/bench_vs_nvitop.py beside nvitop, 60 s each, $NVITOP_PAIRINGS (default: both pairings),
#             the dashboard with each of $GPU_SOURCES (default auto,smi: NVML in-process, and nvidia-smi as before)
#
# Dry run without a GPU: DRY_RUN=sim scripts/device_wave4.sh warm (the simulated host, gpu_hog --sim).
# .whl/ holds the wheels the machine lacks (textual, asyncssh, nvitop, ...); see the device README.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-out}
ENGINE_MIB=${ENGINE_MIB:-16384}
NVITOP_PAIRINGS=${NVITOP_PAIRINGS:-defaults,fast}
GPU_SOURCES=${GPU_SOURCES:-auto,smi}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1 && [ -z "${DRY_RUN:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
STATE=${TD_STATE:-/tmp/td}
export XDG_STATE_HOME=$STATE/state XDG_CONFIG_HOME=$STATE/config XDG_DATA_HOME=$STATE/data XDG_CACHE_HOME=$STATE/cache
td() { $PY -m app "$@"; echo "  -> rc=$? ($(date +%T.%N | cut -c1-12))"; }

PROFILE=profiles/gpu-hog-warm.toml
if [ "${DRY_RUN:-}" = sim ]; then  # the same profile on the simulated host, gpu_hog holding simulated memory
  PROFILE=$STATE/gpu-hog-warm.toml
  mkdir -p "$STATE"
  $PY -c "from pathlib import Path; from app.sim.host_env import reset_state; reset_state(Path('$STATE/sim'))"
  sed -e "s|^host = \"local\"|host = \"sim\"\nsim_state = \"$STATE/sim\"|" -e "s|^python = \"python3\"|python = \"$PY\"|" \
      -e "s|{profile_dir}/../scripts/gpu_hog.py\"|$PWD/scripts/gpu_hog.py\", \"--sim\"|g" \
      -e "s|/tmp/tunedash-gpu-hog-warm.ready|$STATE/daemon.ready|g" profiles/gpu-hog-warm.toml > "$PROFILE"
  export TUNEDASH_SIM_STATE=$STATE/sim PATH=$STATE/sim/bin:$PATH
else
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import sys, torch, pynvml; pynvml.nvmlInit(); print(sys.version.split()[0], "torch", torch.__version__, "nvml", pynvml.nvmlSystemGetNVMLVersion())'
fi

part_warm() {
  echo "== warm: $PROFILE, engine $ENGINE_MIB MiB"
  td launch "$PROFILE" --set "mib=$ENGINE_MIB" --wait --timeout 180
  $PY scripts/nvml_holders.py "$PROFILE"
  echo "-- tunedash free --timeout 1 (both roles hold memory: STUCK naming each holder's owner)"
  td free "$PROFILE" --timeout 1
  echo "-- kill the engine: WARM with the daemon's MiB"
  td kill "$PROFILE" --confirm-free --timeout 60
  $PY scripts/nvml_holders.py "$PROFILE"
  echo "-- relaunch with the engine at half the memory: the daemon is kept"
  td relaunch "$PROFILE" --set "mib=$((ENGINE_MIB / 2))" --timeout 60 --ready-timeout 180
  $PY scripts/nvml_holders.py "$PROFILE"
  echo "-- kill --all: FREE at 0 MiB"
  td kill "$PROFILE" --all --timeout 60
  $PY scripts/nvml_holders.py "$PROFILE"
}

part_release() {
  $PY bench/bench_release.py --rounds 5 --mib 16384 --sources nvml,smi --json "$OUT/release.json"
}

part_nvitop() {
  td launch profiles/gpu-hog.toml --set mib=16384 --wait --timeout 120
  $PY -m nvitop --version 2>&1 | head -1
  $PY bench/bench_vs_nvitop.py --profile profiles/gpu-hog.toml --seconds 60 --pairings "$NVITOP_PAIRINGS" \
      --gpu-sources "$GPU_SOURCES" \
      --other "$PY -m nvitop" --other-fast "$PY -m nvitop --interval 0.25"
  td kill profiles/gpu-hog.toml --confirm-free
}

parts=${*:-warm nvitop release}
for part in $parts; do
  case "$part" in
    warm|release|nvitop) SECONDS=0; "part_$part" 2>&1 | tee "$OUT/$part.log"; echo "== $part took ${SECONDS} s" ;;
    *) echo "usage: $0 [warm] [release] [nvitop]"; exit 2 ;;
  esac
done
