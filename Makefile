# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv and install
# everything first. torch is installed on its own, pinned exactly, BEFORE the project: an
# unpinned torch pulls gigabytes of CUDA wheels.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_PIN := torch==2.13.0
export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: setup browser demo test test-unit test-integration bench bench-analysis clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e ".[server,flows,dev]"
	touch $(STAMP)

setup: $(STAMP)

# Extra options: make demo DEMO_ARGS="--fault hang --fault-rank 2"
DEMO_ARGS ?=
demo: setup
	$(VENV)/bin/rankstream demo $(DEMO_ARGS)

# The HTML report's tests load pages in Debian's chromium (playwright cannot download a browser here).
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

# Two workers run every test but the timed ones (most wait on processes, not on the CPU); the
# timed ones then run alone, so that a parallel test's load never decides a latency bound. Both
# parts always run; the target fails if either does.
test: setup browser
	@rc=0; \
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not timed" --durations=25 tests || rc=$$?; \
	$(PY) -m pytest -q -m timed --durations=10 tests || rc=$$?; \
	exit $$rc

test-unit: setup
	@rc=0; \
	$(PY) -m pytest -q -n 2 -m "not integration and not timed" tests || rc=$$?; \
	$(PY) -m pytest -q -m "timed and not integration" tests || rc=$$?; \
	exit $$rc

test-integration: setup
	$(PY) -m pytest -q -m integration tests

bench: setup
	$(PY) bench/ingest.py
	$(PY) bench/overhead.py

# The analysis benchmark's peers: Holistic Trace Analysis (its package requires jupyterlab; only its
# runtime needs are installed) and Composer's published trace merger (a stdlib-only script inside the
# mosaicml wheel, run by its path; the wheel's own requirements are not needed for it).
bench-analysis: setup
	$(PY) -m pip install -q pandas plotly networkx pydot
	$(PY) -m pip install -q --no-deps HolisticTraceAnalysis==0.5.0 mosaicml==0.32.1
	$(PY) bench/analysis.py
	$(PY) bench/diagnosis.py

clean:
	rm -rf $(VENV) build dist *.egg-info .rankstream rankstream.duckdb*
