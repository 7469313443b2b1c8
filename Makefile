# Each target makes its own virtual environment (.venv), so nothing needs root or the system Python.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test bench clean

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

$(VENV)/.bench: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $@

demo: $(VENV)/.installed
	$(PY) -m tppasm demo

test: $(VENV)/.installed
	$(PY) -m pytest tests

bench: $(VENV)/.bench
	$(PY) -m bench all

clean:
	rm -rf $(VENV) *.egg-info
