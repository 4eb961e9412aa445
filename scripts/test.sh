#!/usr/bin/env bash
# `make test` once setup and lint are done. The VM tier (one emulated vCPU: the longest
# tier, and mostly one core's work) runs in the background beside the host tiers, then
# the unit tier runs again on Python 3.13. The VM tier's output is shown once it ends;
# any of the three failing fails the run.
set -uo pipefail
cd "$(dirname "$0")/.."

started=$(date +%s)
vm_log=$(mktemp /tmp/plexus-vm-tier.XXXXXX)
.venv/bin/pytest -q -p no:cacheprovider tests/vm >"$vm_log" 2>&1 &
vm=$!
# Interrupted: the VM tier's pytest ends its VM and cleans up on SIGINT, as from a terminal.
trap 'kill -INT "$vm" 2>/dev/null; wait "$vm"; rm -f "$vm_log"; exit 130' INT TERM

.venv/bin/pytest -q -p no:cacheprovider tests --ignore=tests/vm
host=$?
echo "----- tests/unit on Python 3.13"
.venv-py313/bin/pytest -q -p no:cacheprovider tests/unit
py313=$?
echo "----- tests/vm (run beside the others; its output follows)"
wait "$vm"
vm_rc=$?
cat "$vm_log"
rm -f "$vm_log"

echo "make test: host tiers exit $host, unit tier on 3.13 exit $py313, VM tier exit $vm_rc;" \
    "$(($(date +%s) - started)) s"
((host == 0 && py313 == 0 && vm_rc == 0))
