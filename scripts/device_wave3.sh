#!/usr/bin/env bash
# device_wave3.sh: issue 23 on a lent GPU host, in two parts that each fit one device call (outputs under $OUT).
#
#   scripts/device_wave3.sh release   bench/bench_release.py: kill -> FREE against the driver's own release seen by
#                                     a side NVML reader, before/after the issue-20 release watch, nvml and smi
#   scripts/device_wave3.sh nvitop    bench/bench_vs_nvitop.py: the dashboard beside nvitop on a gpu-hog holding
#                                     memory, 60 s each, each tool's default pace and both at 4 Hz
# .whl/ holds the wheels the machine lacks (textual, asyncssh, nvitop, ...); see the device README.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export XDG_STATE_HOME=/tmp/td-state XDG_CONFIG_HOME=/tmp/td-config XDG_DATA_HOME=/tmp/td-data
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import sys, torch, pynvml; pynvml.nvmlInit(); print(sys.version.split()[0], "torch", torch.__version__, "nvml", pynvml.nvmlSystemGetNVMLVersion())'
case "${1:-}" in
  release)
    python3 bench/bench_release.py --rounds 5 --mib 16384 --sources nvml,smi --json "$OUT/release.json" 2>&1 | tee "$OUT/release.log"
    ;;
  nvitop)
    python3 -m app launch profiles/gpu-hog.toml --set mib=16384 --wait --timeout 120; echo "launch rc=$?"
    python3 -m nvitop --version 2>&1 | head -1
    python3 bench/bench_vs_nvitop.py --profile profiles/gpu-hog.toml --seconds 60 \
        --other "python3 -m nvitop" --other-fast "python3 -m nvitop --interval 0.25" 2>&1 | tee "$OUT/nvitop.log"
    python3 -m app kill profiles/gpu-hog.toml --confirm-free; echo "kill rc=$?"
    ;;
  *) echo "usage: $0 release|nvitop"; exit 2 ;;
esac
