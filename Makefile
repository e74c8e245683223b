# The README's two commands: `make demo` (the main job) and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OVERRIDES := requirements/mlagents-py311.txt
# Two pytest workers: most tests wait on processes, timeouts and ports more than they compute.
# loadgroup: the Ray tests (xdist_group "ray") share one worker, so Ray starts once.
PYTEST_ARGS ?= -n 2 --dist loadgroup

.PHONY: install demo test test-fast lint bench chaos doctor clean

install: $(STAMP)

# See docs/install.md for why ML-Agents is installed this way. pip shows what it installs.
$(STAMP): setup.py $(OVERRIDES)
	@echo "==> [1/6] virtual environment $(VENV)"
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	@echo "==> [2/6] pip"
	$(BIN)/pip install --upgrade "pip>=23"
	@echo "==> [3/6] what ML-Agents 1.1.0 needs on Python 3.11 (torch 2.13.0 CPU first: a few minutes)"
	$(BIN)/pip install -r $(OVERRIDES)
	@echo "==> [4/6] mlagents and mlagents-envs 1.1.0, without their unsatisfiable pins"
	$(BIN)/pip install --no-deps --ignore-requires-python mlagents==1.1.0 mlagents-envs==1.1.0
	@echo "==> [5/6] mlagents-plugin with its dev and ray extras"
	$(BIN)/pip install -c $(OVERRIDES) -e ".[dev,ray]"
	@echo "==> [6/6] fast protobuf for mlagents-envs, then the doctor's check"
	$(BIN)/python -m mlagents_plugin.fast_protobuf --install-pth
	$(BIN)/python -m mlagents_plugin doctor
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m mlagents_plugin.demo

test: lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The process-free tests (the manager's logic on a fake backend, settings, wire format): < 60 s.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m fast -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/bench.py

# Three minutes of random faults through stock mlagents-learn (docs/faults.md#the-chaos-run).
chaos: $(STAMP)
	$(BIN)/python benchmarks/chaos.py --duration 180

doctor: $(STAMP)
	$(BIN)/python -m mlagents_plugin doctor

clean:
	rm -rf $(VENV) results *.egg-info
