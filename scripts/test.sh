#!/usr/bin/env bash
# The project's test command (README): the main suite with the current Python (the .venv of the
# quick start), then the SkyRL suite in .venv312 — SkyRL needs Python >= 3.12, so that venv is
# built here on first use (torch for 3.12 is a CUDA build of a few GB; pip caches it).
# DEEPANALYZE_SKIP_SKYRL=1 runs only the main suite.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v chromium >/dev/null 2>&1 && [ -z "${DEEPANALYZE_CHROMIUM:-}" ]; then
  echo "note: Debian's chromium is not installed, so the browser tests of 'deepanalyze-rl view'" \
       "(tests/test_view.py) will skip; apt-get install chromium (what .ci/run does) runs them" >&2
fi
python -m pytest -q

if [ "${DEEPANALYZE_SKIP_SKYRL:-0}" = 1 ]; then
  echo "SkyRL suite skipped (DEEPANALYZE_SKIP_SKYRL=1)"
  exit 0
fi

if PYENV_VERSION=3.12.1 python3.12 --version >/dev/null 2>&1; then
  PY312=(env PYENV_VERSION=3.12.1 python3.12)   # pyenv machines: the bare shim refuses
elif python3.12 --version >/dev/null 2>&1; then
  PY312=(python3.12)
else
  echo "error: the SkyRL suite needs python3.12 on PATH (or set DEEPANALYZE_SKIP_SKYRL=1)" >&2
  exit 2
fi
if [ ! -x .venv312/bin/python ]; then
  "${PY312[@]}" -m venv .venv312
  .venv312/bin/python -m pip install --quiet --upgrade pip
fi
.venv312/bin/python -m pip install --quiet "torch==2.13.0"
.venv312/bin/python -m pip install --quiet -e ".[skyrl,kernel,test]"
.venv312/bin/python -m pytest -q tests/skyrl
