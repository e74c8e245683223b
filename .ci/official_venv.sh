#!/usr/bin/env bash
# A Python 3.10 environment made as ML-Agents' install guide makes one (pip install mlagents==VERSION),
# then the plugin's wheel installed as a user installs it, with the check that it changed nothing
# already there but setuptools; then the wheel again with EXTRAS, for the tests. Run by the Makefile.
#
#   .ci/official_venv.sh PYTHON310 VENV MLAGENTS_VERSION WHEEL EXTRAS
set -euo pipefail
python=$1 venv=$2 version=$3 wheel=$4 extras=$5
pip="$venv/bin/pip"

echo "==> [1/4] Python 3.10 virtual environment $venv, made afresh"
rm -rf "$venv"
"$python" -m venv "$venv"
"$pip" install --upgrade "pip>=23"

echo "==> [2/4] pip install mlagents==$version, ML-Agents' own instruction (torch from the registry: minutes)"
echo "    mlagents declares Requires-Python <=3.10.12 and this is $("$python" -V): that bound is ignored for"
echo "    mlagents and mlagents-envs alone (their dependencies keep theirs), then pip installs the rest"
"$pip" install --no-deps --ignore-requires-python "mlagents==$version" "mlagents-envs==$version"
"$pip" install "mlagents==$version"
"$pip" freeze --all > "$venv/freeze-before.txt"

echo "==> [3/4] the plugin's wheel: nothing already installed may change but setuptools"
"$pip" install "$wheel"
"$pip" freeze --all > "$venv/freeze-after.txt"
"$venv/bin/python" "$(dirname "$0")/plugin_install_diff.py" "$venv/freeze-before.txt" "$venv/freeze-after.txt"

echo "==> [4/4] its $extras extras (for the tests), then the doctor's check"
"$pip" install "$wheel[$extras]"
"$venv/bin/python" -m mlagents_plugin doctor
