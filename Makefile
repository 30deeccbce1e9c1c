# Quick start targets. Each creates .venv on first use; nothing needs the network beyond pip.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: test test-fast test-slow test-native lint docs train bench bench-optimizer clean

$(VENV)/.installed-test: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,dist]'
	touch $@

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# The whole suite: every tier, the generated C kernels in the folders tests/tiers.py names, on
# TEST_WORKERS processes (pytest-xdist; 2 by default, the cores CI has: the suite's own time is
# mostly one core's, so two workers halve it; TEST_WORKERS=0 runs it in this process).
TEST_WORKERS ?= 2
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

# The unit tests of every package (tests/tiers.py lists them), the numpy kernels only: about a
# minute on two cores. The five slowest are listed, to keep the tier honest.
test-fast: $(VENV)/.installed-test
	TOOLKIT_NATIVE=0 $(BIN)/python -m pytest -q -m "fast and not slow" --durations=5 $$($(BIN)/python -m tests.tiers)

# ruff: pyflakes, pycodestyle and import order, configured in pyproject.toml.
lint: $(VENV)/.installed-test
	$(BIN)/ruff check .

# The documentation site (mkdocs.yml) into site/, strict: a broken link, a page missing from the
# nav, or a layer parameter, command-line option, pass or setting without a description fails it.
# The layer catalog, the command line, the optimiser's passes, the settings and the changelog are
# generated from the code and CHANGELOG.md as it builds (docs/hooks/).
# (Not --quiet: MkDocs 1.6 then counts no warnings, and strict mode lets a broken link through.)
$(VENV)/.installed-docs: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $@

docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

# The longer sweeps (3000 random nets through the optimiser against the reference interpreter).
test-slow: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -m slow

# Trains zoo/lenet on the digits that ship with the toolkit, then scores held-out digits with
# `toolkit infer` (the net's test split, never seen in training). Each `make train` is a run of
# its own (a run folder never takes a second run): runs/lenet-DATE-TIME.
RUN := runs/lenet-$(shell date +%Y%m%d-%H%M%S)
train: $(VENV)/.installed
	$(BIN)/toolkit train zoo/lenet/net.yaml --out $(RUN)
	$(BIN)/toolkit data zoo/lenet/net.yaml --split test --out $(RUN)/heldout.npz
	$(BIN)/toolkit infer zoo/lenet/net.yaml --weights $(RUN)/model.safetensors \
	    --input $(RUN)/heldout.npz --output $(RUN)/heldout_prob.npz
	@$(BIN)/python -c "import numpy as np; \
	    p = np.load('$(RUN)/heldout_prob.npz')['prob']; y = np.load('$(RUN)/heldout.npz')['label']; \
	    print(f'held-out accuracy: {(p.argmax(1) == y).mean():.4f} on {len(y)} digits')"

bench: $(VENV)/.installed-test
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python benchmarks/compare.py benchmarks/nets/lenet.yaml --batch 64

# toolkit bench with and without the optimiser on every zoo net, infer and train.
bench-optimizer: $(VENV)/.installed
	$(BIN)/python benchmarks/optimizer.py

clean:
	rm -rf $(VENV) build site *.egg-info

# The whole suite through the generated native kernels (compiles a unit per plan: slower cold).
test-native: $(VENV)/.installed-test
	TOOLKIT_NATIVE=1 $(BIN)/python -m pytest -q
