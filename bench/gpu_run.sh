#!/usr/bin/env bash
# The prepared GPU run of issue 29 (bench/gpu_run.py says what it measures): `bash bench/gpu_run.sh [ARGS]` from
# the repository root on a machine with one GPU, or `make gpu-run`; `--tiny` runs it on the CPU at tiny sizes.
# Results go to $OUT (default reports/gpu-run): gpu_run.json, gpu_run.md, hmm-gpu.tar, hmm-sticky-gpu.tar and
# this run's log, gpu_run.log. PY picks the interpreter (default python3: the device machine's, which has torch
# and transformers); where it lacks transformer-lens, the wheels in wheels/ (`make gpu-wheels`) are installed into
# a scratch folder first, offline; without them the benchmark sections are skipped with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${OUT:-reports/gpu-run}
SITE=${SITE:-/tmp/ib-gpu-site}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
if ! "$PY" -c "import transformer_lens" >/dev/null 2>&1; then
  if compgen -G "wheels/*.whl" >/dev/null; then
    echo "== installing $(ls wheels/*.whl | wc -l) wheels from wheels/ into $SITE (no network)"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" wheels/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "== transformer-lens is not installed and wheels/ holds no wheels (make gpu-wheels fills it):" \
         "the benchmark and placement sections will be skipped"
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" bench/gpu_run.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_run.log"
