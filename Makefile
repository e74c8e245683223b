# The README's two commands: `make demo` (the main job) and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OVERRIDES := requirements/mlagents-py311.txt
# Two pytest workers: most tests wait on processes, timeouts and ports more than they compute.
# loadgroup: the Ray tests (xdist_group "ray") share one worker, so Ray starts once.
PYTEST_ARGS ?= -n 2 --dist loadgroup

.PHONY: install demo test bench doctor clean

install: $(STAMP)

# See docs/install.md for why ML-Agents is installed in three steps.
$(STAMP): setup.py $(OVERRIDES)
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade "pip>=23"
	$(BIN)/pip install --quiet -r $(OVERRIDES)
	$(BIN)/pip install --quiet --no-deps --ignore-requires-python mlagents==1.1.0 mlagents-envs==1.1.0
	$(BIN)/pip install --quiet -c $(OVERRIDES) -e ".[dev,ray]"
	$(BIN)/python -m mlagents_plugin.fast_protobuf --install-pth
	$(BIN)/python -m mlagents_plugin doctor
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m mlagents_plugin.demo

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/bench.py

doctor: $(STAMP)
	$(BIN)/python -m mlagents_plugin doctor

clean:
	rm -rf $(VENV) results *.egg-info
