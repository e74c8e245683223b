#!/usr/bin/env bash
# A Python 3.10 environment made as ML-Agents' install guide makes one (pip install mlagents==VERSION),
# then the plugin's wheel installed, reinstalled (--force-reinstall), upgraded (-U) and uninstalled
# as a user does, with the check after each that nothing ML-Agents installed changed but setuptools
# and that mlagents-learn still starts; then the wheel again with EXTRAS, for the tests. Run by the
# Makefile.
#
#   .ci/official_venv.sh PYTHON310 VENV MLAGENTS_VERSION WHEEL EXTRAS
set -euo pipefail
python=$1 venv=$2 version=$3 wheel=$4 extras=$5
pip="$venv/bin/pip"
diff_script="$(dirname "$0")/plugin_install_diff.py"

# pip freeze --all after the command, compared with ML-Agents' own environment (freeze-before.txt).
check_freeze() {  # NAME COMMAND...
    local name=$1
    shift
    "$pip" freeze --all > "$venv/freeze-$name.txt"
    "$venv/bin/python" "$diff_script" "$venv/freeze-before.txt" "$venv/freeze-$name.txt" \
        --wheel "$wheel" --what "$*"
}

# mlagents-learn --help starts (it imports mlagents.trainers, which fails under numpy >= 1.24).
check_learn_starts() {
    if ! "$venv/bin/mlagents-learn" --help > "$venv/learn-help.txt" 2>&1; then
        tail -n 5 "$venv/learn-help.txt"
        echo "mlagents-learn --help failed (above)"
        return 1
    fi
    echo "mlagents-learn --help works"
}

echo "==> [1/7] Python 3.10 virtual environment $venv, made afresh"
rm -rf "$venv"
"$(dirname "$0")/free_space.sh" 6 "$(dirname "$venv")" "$venv (torch's CUDA build among it)"
"$python" -m venv "$venv"
"$pip" install --upgrade "pip>=23"

echo "==> [2/7] pip install mlagents==$version, ML-Agents' own instruction (torch from the registry: minutes)"
echo "    mlagents declares Requires-Python <=3.10.12 and this is $("$python" -V): that bound is ignored for"
echo "    mlagents and mlagents-envs alone (their dependencies keep theirs), then pip installs the rest"
"$pip" install --no-deps --ignore-requires-python "mlagents==$version" "mlagents-envs==$version"
"$pip" install "mlagents==$version"
"$pip" freeze --all > "$venv/freeze-before.txt"

echo "==> [3/7] pip install the plugin's wheel: nothing already installed may change but setuptools"
"$pip" install "$wheel"
check_freeze after pip install "$wheel"
check_learn_starts

echo "==> [4/7] pip install --force-reinstall: every requirement reinstalled at the newest version it allows"
"$pip" install --force-reinstall "$wheel"
check_freeze force-reinstall pip install --force-reinstall "$wheel"
check_learn_starts

echo "==> [5/7] pip install -U"
"$pip" install -U "$wheel"
check_freeze upgrade pip install -U "$wheel"
check_learn_starts

echo "==> [6/7] pip uninstall -y mlagents-plugin: mlagents-learn still starts, without it"
"$pip" uninstall -y mlagents-plugin
check_freeze uninstall pip uninstall -y mlagents-plugin
check_learn_starts

echo "==> [7/7] the wheel with its $extras extras (for the tests), then the doctor's check"
"$pip" install "$wheel[$extras]"
"$venv/bin/python" -m mlagents_plugin doctor
