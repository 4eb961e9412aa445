#!/usr/bin/env bash
# Idempotent setup: Debian packages, then .venv with Plexus installed (editable).
set -euo pipefail
cd "$(dirname "$0")/.."

# python3-venv: Debian's python3.11 has no ensurepip without it, so `-m venv` fails.
APT_PACKAGES=(containernetworking-plugins iproute2 iputils-ping gcc libc6-dev openssl containerd runc
    python3-venv)
APT=(apt-get -o DPkg::Lock::Timeout=300) # other setups may hold the lock

missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    "${APT[@]}" update -qq
    DEBIAN_FRONTEND=noninteractive "${APT[@]}" install -y -qq --no-install-recommends "${missing[@]}"
fi

# The real interpreter, not a pyenv shim (the shim costs ~100 ms per exec).
PYTHON=$(python3.11 -c 'import sys; print(sys.executable)')
stamp=.venv/.plexus-setup
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ ! -x .venv/bin/python3 ]] || [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
    echo "setup: building .venv with $PYTHON"
    "$PYTHON" -m venv .venv
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -e '.[dev]'
    echo "$want" > "$stamp"
fi
test -x .venv/bin/plexus

# gRPC stubs from the .proto files (build outputs, not in git); regenerated only when a .proto changes.
.venv/bin/python3 scripts/gen-protos.py

# The VM tier: QEMU, the pinned Debian kernel, virtme-ng (ipvlan, VLAN, SR-IOV tests).
scripts/setup-vm.sh

# Go-built components for the cluster tier and benchmarks: etcd, kube-apiserver, kubelet,
# Multus thin, cnitool (cached in /var/cache/plexus-go-tools; first run ~7 min, then <1 s).
scripts/build-go-tools.sh
echo "setup: ok"
