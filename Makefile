# AI Runtime — developer entry points. `make demo` and `make test` work on a fresh clone.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
BUF := node_modules/.bin/buf

.PHONY: help install demo test test-fast lint typecheck docs docs-check proto proto-check buf-check run bench chaos clean

help:
	@echo "make demo        run the whole flow on SQLite with the local DeepSeek stand-in"
	@echo "make test        lint, type-check, proto checks and the whole test suite (SQLite + MariaDB if reachable)"
	@echo "make run         start every service in the foreground (python -m launcher --dev)"
	@echo "make docs        regenerate docs/configuration.md and build the docs site into site/ (offline)"
	@echo "make proto       regenerate the Python stubs from protos/"
	@echo "make bench       benchmarks against MariaDB, and the procrastinate peer on PostgreSQL (writes bench-results/)"
	@echo "make chaos       fault harness: real processes on MariaDB, one fault at a time, SQL audit"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev]"
	@touch $(STAMP)

# The bench's own extras (procrastinate and psycopg for the peer scenario), never the
# services': `make install`, `make test` and `make bench` install them on top of dev.
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[dev,bench]"
	@touch $(BENCH_STAMP)

$(BUF): package.json
	npm install --no-audit --no-fund --loglevel=error
	@touch $(BUF)

install: $(STAMP) $(BENCH_STAMP) $(BUF)

demo: $(STAMP)
	$(BIN)/python -m demo $(if $(DEMO_FILE),--file "$(DEMO_FILE)")

run: $(STAMP)
	$(BIN)/python -m launcher --dev

proto: $(STAMP)
	$(BIN)/python scripts/gen_protos.py

proto-check: $(STAMP)
	$(BIN)/python scripts/gen_protos.py --check

buf-check: $(BUF)
	$(BUF) lint
	$(BUF) format --diff --exit-code
	@if git rev-parse -q --verify HEAD~1 >/dev/null && git cat-file -e HEAD~1:buf.yaml 2>/dev/null; then \
	  echo "buf breaking against HEAD~1"; $(BUF) breaking --against '.git#ref=HEAD~1'; \
	else echo "buf breaking: no previous commit with buf.yaml"; fi

# The docs site (mkdocs-material, offline). `make docs` regenerates the configuration page
# from the settings classes, then builds; `make test` only checks (a stale page fails).
docs: $(STAMP) $(BUF)
	$(BIN)/python scripts/gen_config_docs.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-check: $(STAMP) $(BUF)
	$(BIN)/python scripts/gen_config_docs.py --check
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir "$$tmp"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(BENCH_STAMP)
	$(BIN)/mypy

# The whole suite. MariaDB tests run when TEST_MYSQL_URL is set, or when a MariaDB
# answers on 127.0.0.1:3306 as root without a password (this machine's default); then
# the MariaDB tests but the e2e ones run once more on the other MySQL driver (also after
# a failure of the first run, so that both drivers' results are shown; either fails it).
test: install lint typecheck docs-check proto-check buf-check
	@export TEST_MYSQL_URL="$${TEST_MYSQL_URL:-$$($(BIN)/python scripts/detect_mysql.py)}"; \
	  echo "TEST_MYSQL_URL=$${TEST_MYSQL_URL:-<unset: MariaDB tests skipped>}"; \
	  status=0; \
	  $(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) || status=$$?; \
	  if [ -n "$${TEST_MYSQL_URL}" ]; then \
	    export TEST_MYSQL_URL="$$($(BIN)/python scripts/detect_mysql.py --other-driver "$$TEST_MYSQL_URL")"; \
	    echo "MariaDB tests once more on the other driver: $${TEST_MYSQL_URL%%://*}"; \
	    $(BIN)/python -m pytest -q -p no:cacheprovider -m "mysql and not e2e" $(PYTEST_ARGS) || status=$$?; \
	  fi; \
	  exit $$status

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -x -m "not e2e and not mysql" $(PYTEST_ARGS)

bench: $(BENCH_STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)

# Fault table on MariaDB (real processes): CHAOS_ARGS e.g. "--fault worker_kill --profile long",
# "--profile soak --soak-seconds 180". Without a MariaDB a private mariadbd is started.
chaos: $(STAMP)
	@export TEST_MYSQL_URL="$${TEST_MYSQL_URL:-$$($(BIN)/python scripts/detect_mysql.py)}"; \
	  $(BIN)/python -m chaos $(CHAOS_ARGS)

clean:
	rm -rf var bench-results site .pytest_cache .mypy_cache .ruff_cache
