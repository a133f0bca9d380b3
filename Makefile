# Development entry points. Every tool runs from .venv explicitly, so no activated venv is needed.
# Recipes are POSIX sh.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# `make demo` needs only the base install (no server extra, no test tooling): seconds, not minutes.
DEMO_STAMP := $(VENV)/.installed-demo
TOOLLEDGER := $(BIN)/toolledger
PYTEST_ARGS ?=
# The broker `make pytest` starts when no stack runs: Apache Kafka, the broker users run (needs
# java and mvn; its jars come from Maven Central once). `make test` runs the whole suite on it,
# then the tansu lane: the tests marked both_brokers (tests/contract and a few more) on tansu,
# the quick local broker, so it keeps working.
DEV_KAFKA ?= apache
TANSU_LANE_ARGS ?= -m both_brokers
PEERS_ARGS ?=

.PHONY: help venv lint test lane pytest demo bench bench-peers clean

help:
	@echo "make venv    create .venv and install toolledger with its test extras (server included)"
	@echo "make lint    ruff check, ruff format --check, mypy --strict"
	@echo "make test    lint, the whole suite on Apache Kafka, then the tansu lane (needs java, mvn)"
	@echo "make pytest  the whole test suite against the dev stack, without lint (DEV_KAFKA=tansu|apache)"
	@echo "make demo    the billing demo on the embedded ledger; installs only the base package"
	@echo "make bench   the benchmarks"
	@echo "make bench-peers  toolledger, Restate and DBOS side by side (installs the peers under .toolledger/peers;"
	@echo "             DEV_KAFKA=apache|tansu: the broker toolledger's rows run on)"
	@echo "make clean   stop the dev stack, remove caches and build output (keeps .venv)"

venv: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall whenever pyproject.toml changes (new dependency, new extra, new entry point).
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e '.[test]'
	touch $(STAMP)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Each lane prints its wall time. The two lanes run one after the other: two brokers and two
# suites at once would not fit two cores.
test: venv lint
	@$(MAKE) --no-print-directory lane DEV_KAFKA=apache
	@$(MAKE) --no-print-directory lane DEV_KAFKA=tansu PYTEST_ARGS="$(TANSU_LANE_ARGS)"

lane:
	@began=$$(date +%s); status=0; \
	$(MAKE) --no-print-directory pytest DEV_KAFKA=$(DEV_KAFKA) PYTEST_ARGS='$(PYTEST_ARGS)' || status=$$?; \
	echo "lane $(DEV_KAFKA): $$(( $$(date +%s) - began )) s, exit status $$status"; \
	exit $$status

# Brings the dev stack up (on DEV_KAFKA) unless both services are given or a stack already runs,
# runs the suite, and stops the stack again only if this recipe started it, keeping pytest's
# status. A running stack on another broker is left alone: the suite then starts a broker of
# its own for the session (tests/conftest.py, TOOLLEDGER_DEV_KAFKA). pytest's status 5 means it
# collected no tests, which here means a broken suite.
pytest: venv
	@started=no; \
	if [ -z "$${TOOLLEDGER_DATABASE_URL:-}" ] || [ -z "$${TOOLLEDGER_KAFKA_BOOTSTRAP:-}" ]; then \
		if ! $(TOOLLEDGER) dev status --check; then \
			started=yes; \
			trap '$(TOOLLEDGER) dev down; exit 130' INT TERM; \
			$(TOOLLEDGER) dev up --kafka $(DEV_KAFKA) || { $(TOOLLEDGER) dev down; exit 1; }; \
		fi; \
	fi; \
	status=0; TOOLLEDGER_DEV_KAFKA=$(DEV_KAFKA) $(BIN)/pytest $(PYTEST_ARGS) || status=$$?; \
	if [ "$$started" = yes ]; then $(TOOLLEDGER) dev down || true; fi; \
	if [ "$$status" -eq 5 ]; then echo "pytest collected no tests: failing" >&2; status=1; fi; \
	exit $$status

# A venv made by `make venv` already holds everything the demo needs; otherwise install the base
# package alone (what `pip install toolledger` gives a runtime). --no-compile: byte-compiling
# every installed module was a third of the install's time; Python compiles what the demo imports.
$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	@if [ ! -f $(STAMP) ] || [ pyproject.toml -nt $(STAMP) ]; then \
		$(BIN)/python -m pip install --no-compile -e .; \
	fi
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(TOOLLEDGER) demo

bench: venv
	@if [ -f benchmarks/__main__.py ]; then \
		$(BIN)/python -m benchmarks; \
	else \
		echo "No benchmarks yet (benchmarks/__main__.py is missing)."; \
	fi

# Restate and DBOS beside toolledger (benchmarks/peers). The peers get a virtualenv of their own
# under .toolledger/peers, so their pins never touch toolledger's; the Restate server comes from npm.
PEERS := .toolledger/peers
RESTATE_SERVER := 1.7.12

bench-peers: venv $(PEERS)/.installed
	$(BIN)/python -m benchmarks.peers --kafka $(DEV_KAFKA) $(PEERS_ARGS)

$(PEERS)/.installed: benchmarks/peers/requirements.txt
	mkdir -p $(PEERS)
	$(PYTHON) -m venv $(PEERS)/venv
	$(PEERS)/venv/bin/python -m pip install -r benchmarks/peers/requirements.txt
	npm install --prefix $(PEERS) --no-audit --no-fund @restatedev/restate-server-linux-x64@$(RESTATE_SERVER)
	touch $@

clean:
	@if [ -x $(TOOLLEDGER) ]; then $(TOOLLEDGER) dev down || true; fi
	rm -rf .toolledger build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +
