# agentwal — every target creates .venv from the python3 on PATH if it is missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: docs demo example test test-all test-langgraph-upstream torture bench bench-compare bench-langgraph bench-postgres bench-report lint format clean

# (re)installed when the C walk changes too: the editable install compiles it in place
$(STAMP): pyproject.toml hatch_build.py agentwal/_treewalk.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,langgraph]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m agentwal.demo

example: $(STAMP)
	$(PY) examples/effects_agent.py

# Two pytest-xdist workers, a test file each at a time (module fixtures built once):
# about 9 minutes on two cores, twice that in one process. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest tests -m "not slow" -p no:cacheprovider -rs -n $(TEST_WORKERS) --dist loadfile

# The whole suite with the crash tiers' timed loops stretched (about 5 extra minutes).
test-all: $(STAMP)
	AGENTWAL_TORTURE_SECONDS=$${AGENTWAL_TORTURE_SECONDS:-60} $(PY) -m pytest tests -p no:cacheprovider

# LangGraph's own checkpointer-parametrised tests (from its sdist) with AgentWALSaver injected
# as the sync and the async checkpointer; SAVERS=agentwal,sqlite runs SqliteSaver beside it.
# Downloads the sdist and its test dependencies; takes several minutes, so not part of `test`.
SAVERS ?= agentwal
test-langgraph-upstream: $(STAMP)
	$(PY) tests/langgraph/run_upstream.py --savers $(SAVERS)

# Every fault-injection tier for TORTURE_SECONDS (default 600) in .torture/.
TORTURE_SECONDS ?= 600
torture: $(STAMP)
	$(VENV)/bin/agentwal torture .torture --seconds $(TORTURE_SECONDS) --seed $${SEED:-1}

bench: $(STAMP)
	$(PY) -m pytest bench -p no:cacheprovider --benchmark-only
	$(PY) bench/compare.py

bench-compare: $(STAMP)
	$(PY) bench/compare.py

bench-langgraph: $(STAMP)
	$(PY) bench/langgraph_compare.py

# agentwal on a throwaway PostgreSQL: steps/s beside the local engine; workers beside pgbench;
# AgentWALSaver beside LangGraph's PostgresSaver.
bench-postgres: $(STAMP)
	$(PY) bench/bench_postgres.py
	$(PY) bench/bench_postgres_fleet.py
	$(PY) bench/langgraph_postgres_compare.py

# docs/benchmarks.md's generated section and its plots (docs/images/bench/*.png), from one
# run of every side-by-side measurement saved to bench/report.json (about 12 minutes on the 2-CPU machine of the report).
# `$(PY) bench/report.py --quick` is the same code at tiny sizes (seconds; meaningless figures).
bench-report: $(STAMP)
	$(PY) bench/report.py

lint: $(STAMP)
	$(VENV)/bin/ruff check agentwal tests bench
	$(VENV)/bin/mypy agentwal

format: $(STAMP)
	$(VENV)/bin/ruff format agentwal tests bench
	$(VENV)/bin/ruff check --fix agentwal tests bench

clean:
	rm -rf $(VENV) agentwal/_treewalk*.so .langgraph-upstream .pytest_cache .mypy_cache .ruff_cache .benchmarks .torture demo.awal site build dist *.egg-info

# docs/cli.md's reference part, from each command's --help; then the site (mkdocs.yml) into
# site/, strictly: a broken link, anchor or API reference fails the build.
docs: $(STAMP)
	$(PY) -m agentwal.cli.docs docs/cli.md
	$(PY) -m mkdocs build --strict
