#!/usr/bin/env bash
# Idempotent setup of .venv-py313: Plexus with the [dev] extras on Python 3.13, for the
# unit tier's second run in `make test` (pyproject allows 3.11 to 3.13; lint stays 3.11).
# The interpreter is pyenv's 3.13, which this machine image ships (Debian 12 has none),
# else a python3.13 on PATH; by its real path, not a pyenv shim.
set -euo pipefail
cd "$(dirname "$0")/.."

python=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13.*/bin/python3.13 2>/dev/null |
    sort -V | tail -n1 || true)
if [[ -z $python ]]; then
    python=$(python3.13 -c 'import sys; print(sys.executable)' 2>/dev/null || true)
fi
if [[ -z $python ]]; then
    echo "setup: no Python 3.13 found (pyenv's 3.13 comes with this kind of machine)" >&2
    exit 1
fi

stamp=.venv-py313/.plexus-setup
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $python"
if [[ ! -x .venv-py313/bin/python3 ]] || [[ $(cat "$stamp" 2>/dev/null) != "$want" ]]; then
    echo "setup: building .venv-py313 with $python"
    "$python" -m venv --clear .venv-py313
    .venv-py313/bin/pip install -q -e ".[dev]"
    echo "$want" >"$stamp"
fi
