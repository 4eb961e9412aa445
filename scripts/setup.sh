#!/usr/bin/env bash
# Idempotent setup for `make test`: the base (scripts/setup-base.sh: Debian packages, .venv
# with the [dev] extras) plus every test tier's extras.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-base.sh --dev
# .venv-py313: the unit tier runs on Python 3.13 as well.
scripts/setup-py313.sh
# openssl: the cluster tier's certificates. containerd, runc: the runtime and cluster tiers.
# buildah, mmdebstrap: scripts/build-image.sh builds the image with no registry.
# valgrind: tests/bench/bench_instructions counts instructions with callgrind. strace: the
# netns tier sees which files an ADD fsyncs.
scripts/apt-install.sh openssl containerd runc buildah mmdebstrap valgrind strace

# The VM tier: QEMU, the pinned Debian kernel, virtme-ng (ipvlan, VLAN, SR-IOV tests).
scripts/setup-vm.sh

# Go-built components for the runtime and cluster tiers and benchmarks: containerd 2.x,
# etcd, Kubernetes 1.37 (kube-apiserver, kubelet, kubectl, controllers), the 1.1.0-capable
# tuning plugin, Multus, cnitool (cached in /var/cache/plexus-go-tools; see the script for
# the first run's time, then <1 s).
scripts/build-go-tools.sh
echo "setup: ok"
