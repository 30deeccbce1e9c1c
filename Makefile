# Quick start targets. Each creates .venv on first use; nothing needs the network beyond pip.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: test train bench clean

$(VENV)/.installed-test: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e .
	touch $@

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q

train: $(VENV)/.installed
	@echo "error: 'toolkit train' (solvers, data, checkpoints) is not implemented yet; see README" >&2
	@exit 2

bench: $(VENV)/.installed-test
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python benchmarks/compare.py benchmarks/nets/lenet.yaml --batch 64

clean:
	rm -rf $(VENV) build *.egg-info
