#!/usr/bin/env bash
# Fails at once, saying what to do, when DIR's filesystem has less than GB gigabytes free: a venv
# with torch's CUDA build half-installed fails with "[Errno 28] No space left on device" only after
# minutes of work (a CI run did, 28 minutes in). Run by .ci/run and .ci/official_venv.sh.
#
#   .ci/free_space.sh GB DIR WHAT
set -euo pipefail
need_gb=$1 dir=$2 what=$3
free_kb=$(df -Pk "$dir" | awk 'NR == 2 { print $4 }')
free_gb=$((free_kb / 1024 / 1024))
if [ "$free_gb" -lt "$need_gb" ]; then
    echo "error: $what needs about $need_gb GB free on the filesystem of $dir; $free_gb GB is free." >&2
    echo "Free some space (old clones, their .venv* folders, pip's cache) and run again." >&2
    exit 1
fi
echo "disk: $free_gb GB free on the filesystem of $dir ($what needs about $need_gb GB)"
