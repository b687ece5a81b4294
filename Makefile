# Each target makes its own virtual environment and installs fedclust from pyproject.toml.
PYTHON ?= python3
VENV_DEMO := .venv
VENV_TEST := .venv-test
VENV_FLOWER := .venv-flower
VENV_DOCS := .venv-docs
VENV_MUTATION := .venv-mutation
OUT ?= fedclust-demo

.PHONY: demo test test-slow bench docs clean test-loopback test-deploy mutation

$(VENV_DEMO)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV_DEMO)
	$(VENV_DEMO)/bin/python -m pip install -q --upgrade pip
	$(VENV_DEMO)/bin/python -m pip install -q -e ".[plot]"
	touch $@

$(VENV_TEST)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV_TEST)
	$(VENV_TEST)/bin/python -m pip install -q --upgrade pip
	$(VENV_TEST)/bin/python -m pip install -q -e ".[dev]"
	touch $@

## make demo: run the embedded k-FED example; writes $(OUT)/result.json and result.png
demo: $(VENV_DEMO)/.installed
	$(VENV_DEMO)/bin/fedclust demo --out $(OUT)

## make test: the unit and fast integration tests (not the ones marked slow), one worker per core
## (pytest-xdist; TEST_WORKERS=0 runs them in this process)
TEST_WORKERS ?= auto
test: $(VENV_TEST)/.installed
	$(VENV_TEST)/bin/python -m pytest -q -n $(TEST_WORKERS) -m "not slow and not loopback and not deploy"

## make test-slow: the slower end-to-end checks (Flower simulation, benchmark runs, full audit)
test-slow: $(VENV_TEST)/.installed
	$(VENV_TEST)/bin/python -m pytest -q -m "slow and not loopback and not deploy"

## make bench: the paper-reproduction and speed benchmarks in quick mode
bench: $(VENV_DEMO)/.installed
	$(VENV_DEMO)/bin/python benchmarks/run_all.py --quick

$(VENV_DOCS)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV_DOCS)
	$(VENV_DOCS)/bin/python -m pip install -q --upgrade pip
	$(VENV_DOCS)/bin/python -m pip install -q -e ".[docs]"
	touch $@

## make docs: the documentation site (Sphinx) into docs/_build/html; a warning is an error
docs: $(VENV_DOCS)/.installed
	$(VENV_DOCS)/bin/python -m sphinx -b html -W --keep-going -q docs docs/_build/html

$(VENV_MUTATION)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV_MUTATION)
	$(VENV_MUTATION)/bin/python -m pip install -q --upgrade pip
	$(VENV_MUTATION)/bin/python -m pip install -q -e ".[mutation]"
	touch $@

## make mutation: mutmut over the privacy, secure-aggregation and k-means core, one module at
## a time with its own tests, at low CPU priority (scripts/mutation.py; hours of one core for
## every module); MODULES="core/kmeans.py lloyd/protocol.py" runs some; survivors in docs/developer.md
mutation: $(VENV_MUTATION)/.installed
	$(VENV_MUTATION)/bin/python scripts/mutation.py $(MODULES)

clean:
	rm -rf $(VENV_DEMO) $(VENV_TEST) $(VENV_FLOWER) $(VENV_DOCS) $(VENV_MUTATION) $(OUT) \
		.pytest_cache .mutation docs/_build docs/api

$(VENV_FLOWER)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV_FLOWER)
	$(VENV_FLOWER)/bin/python -m pip install -q --upgrade pip
	$(VENV_FLOWER)/bin/python -m pip install -q -e ".[dev,flower]"
	touch $@

## make test-loopback: real Flower deployment on 127.0.0.1 (SuperLink + 3 SuperNodes, ~40 s),
## result checked against the in-process run (scripts/flower_loopback.sh)
test-loopback: $(VENV_FLOWER)/.installed
	$(VENV_FLOWER)/bin/python -m pytest -q -m loopback tests/flower/test_flower_loopback.py

## make test-deploy: SuperLink, operator and SuperNodes in separate network namespaces with TLS
## and SuperNode authentication (loopback where namespaces cannot be made; a few minutes):
## result = in-process, unregistered node refused, tampered reply rejected, killed node named
## and recovery: ServerApp killed + --resume, SuperLink restarted on its database, SuperNode restarted
test-deploy: $(VENV_FLOWER)/.installed
	$(VENV_FLOWER)/bin/python -m pytest -q -m deploy tests/flower/test_flower_deploy.py
