#!/usr/bin/env bash
# device_proof.sh: tunedash on a real GPU host (issue 8), everything in one go, outputs under $OUT.
#
#   scripts/device_proof.sh            (from the repo root, on the GPU machine; .whl/ holds the wheels the
#                                       machine lacks; OUT defaults to ./device-proof-out)
#
# 1. idle: nvidia-smi CSV + NVML values (scripts/gpu_capture.py), `tunedash gpus --source nvml|smi --json`
# 2. loaded: `tunedash launch gpu-hog --wait` (one torch process per GPU), the same captures, `tunedash gpus`,
#    the process group, then `tunedash kill --confirm-free`
# 3. orphan: launch with orphan-children, `kill -9` the parent alone, `tunedash free --timeout 3` (exit 3,
#    names the holders), then `tunedash kill --confirm-free`
# 4. bench/bench_release.py: kill -> FREE against the driver's release polled by NVML every 5 ms
# Everything lands in $OUT/proof.tgz (fixtures/, bench.json) and $OUT/proof.log.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-proof-out}
R=/tmp/proof
rm -rf "$R"; mkdir -p "$R/fixtures" "$OUT"
exec > >(tee "$OUT/proof.log") 2>&1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
td() { python3 -m app "$@"; }
step() { echo; echo "==== $(date +%T.%N | cut -c1-12) $*"; }
F=$R/fixtures

step "machine"
nvidia-smi
nvidia-smi -L
python3 -c 'import sys, torch, pynvml; print(sys.version.split()[0], "torch", torch.__version__, "nvml", pynvml.nvmlInit() or pynvml.nvmlSystemGetNVMLVersion())'
python3 -m pip show nvidia-ml-py 2>/dev/null | head -2
NG=$(nvidia-smi -L | grep -c '^GPU')
P=profiles/gpu-hog.toml
if [ "$NG" -ge 2 ]; then
  P=/tmp/gpu-hog-2.toml
  sed -e 's/^name = .*/name = "gpu-hog-2"/' -e 's/^gpus = .*/gpus = [0, 1]/' \
      -e "s|{profile_dir}/../scripts/gpu_hog.py|$PWD/scripts/gpu_hog.py|" profiles/gpu-hog.toml > $P
fi
echo "GPUs: $NG, profile $P"; grep -E '^(gpus|command)' $P

step "1. idle"
python3 scripts/gpu_capture.py "$F" idle
td gpus --source nvml --json > "$F/idle_tunedash_nvml.json"; echo "gpus nvml rc=$?"
td gpus --source smi --json > "$F/idle_tunedash_smi.json"; echo "gpus smi rc=$?"
td gpus --source nvml; td gpus --source smi
cat "$F"/idle_query_gpu.csv "$F"/idle_query_gpu_reserved.csv "$F"/idle_compute_apps.csv

step "2. launch gpu-hog, 16 GiB per rank"
td launch $P --set mib=16384 --wait --timeout 120; echo "launch rc=$?"
python3 scripts/gpu_capture.py "$F" loaded
td gpus --source nvml --json > "$F/loaded_tunedash_nvml.json"; echo "gpus nvml rc=$?"
td gpus --source smi --json > "$F/loaded_tunedash_smi.json"; echo "gpus smi rc=$?"
td gpus --source nvml; td gpus --source smi
cat "$F"/loaded_query_gpu.csv "$F"/loaded_query_gpu_reserved.csv "$F"/loaded_compute_apps.csv
td status $P
PGID=$(td status $P --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["pgid"])')
ps -o pid,pgid,ppid,stat,rss,args -g "$PGID"
step "2b. kill --confirm-free"
T0=$(date +%s.%N); td kill $P --confirm-free; RC=$?; T1=$(date +%s.%N)
echo "kill rc=$RC, CLI wall $(python3 -c "print(round($T1-$T0,3))") s"
td gpus --source smi

step "3. orphan: kill -9 the parent alone"
td launch $P --set mib=4096 --set orphan-children=true --wait --timeout 120; echo "launch rc=$?"
PID=$(td status $P --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
PGID=$(td status $P --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["pgid"])')
ps -o pid,pgid,ppid,stat,args -g "$PGID"
kill -9 "$PID"; sleep 1
ps -o pid,pgid,ppid,stat,args -g "$PGID"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
python3 scripts/gpu_capture.py "$F" orphan
td free $P --timeout 3; echo "free rc=$?"
td free $P --timeout 3 --json; echo "free --json rc=$?"
td status $P
td kill $P --confirm-free; echo "kill rc=$?"
td gpus --source smi
python3 scripts/gpu_capture.py "$F" after

step "4. bench: kill -> FREE vs the driver's release"
python3 bench/bench_release.py --rounds 5 --mib 8192 --profile $P --json "$R/bench.json"; echo "bench rc=$?"
if [ "$P" != profiles/gpu-hog.toml ]; then
  step "4b. bench on one GPU"
  python3 bench/bench_release.py --rounds 5 --mib 8192 --json "$R/bench_1gpu.json"; echo "bench rc=$?"
fi

step "done"
tar czf "$OUT/proof.tgz" -C "$R" .
ls -la "$OUT"
