#!/usr/bin/env bash
# Idempotent setup of what Plexus itself and `make demo` need: the Debian packages, then
# .venv with Plexus installed (editable) and its gRPC stubs. scripts/setup.sh runs this
# first and adds the test tiers' extras.
#   scripts/setup-base.sh          the demo's venv: Plexus and grpcio-tools (the [protos] extra)
#   scripts/setup-base.sh --dev    the test venv: Plexus with the [dev] extras
set -euo pipefail
cd "$(dirname "$0")/.."

extras=base
[[ ${1:-} == --dev ]] && extras=dev

# gcc, musl-tools: install-cni compiles the static shim against musl (meta/install.py says
# why); libc6-dev: the test tiers compile with glibc. python3-venv: Debian's python3.11
# has no ensurepip without it, so `-m venv` fails.
scripts/apt-install.sh containernetworking-plugins iproute2 iputils-ping gcc musl-tools libc6-dev \
    python3-venv

# The real interpreter, not a pyenv shim (the shim costs ~100 ms per exec).
PYTHON=$(python3.11 -c 'import sys; print(sys.executable)')
stamp=.venv/.plexus-setup
digest=$(sha256sum pyproject.toml | cut -d' ' -f1)
have=$(cat "$stamp" 2>/dev/null || true)
# A dev venv serves the demo too; a base venv is upgraded in place for the tests.
if [[ ! -x .venv/bin/python3 ]] || { [[ $have != "$digest dev" ]] && [[ $have != "$digest $extras" ]]; }; then
    echo "setup: building .venv ($extras) with $PYTHON"
    "$PYTHON" -m venv .venv
    # The demo's venv skips byte-compiling (~15 s of CPU: the kubernetes client has
    # thousands of modules; Python compiles what it imports on first use). The test venv
    # is compiled: the VM tier's guest sees it read-only (PYTHONDONTWRITEBYTECODE), and
    # without .pyc files every Python process there recompiles its imports under
    # emulation, which made the guest suite ~4x slower than its 900 s limit allows.
    if [[ $extras == dev ]]; then
        .venv/bin/pip install -q -e ".[dev]"
    else
        .venv/bin/pip install -q --no-compile -e ".[protos]"
    fi
    echo "$digest $extras" > "$stamp"
fi
test -x .venv/bin/plexus

# gRPC stubs from the .proto files (build outputs, not in git); regenerated only when a .proto changes.
.venv/bin/python3 scripts/gen-protos.py
