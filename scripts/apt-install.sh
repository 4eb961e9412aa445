#!/usr/bin/env bash
# Install the given Debian packages that are not installed yet (idempotent; waits for a
# concurrent setup's apt lock).
set -euo pipefail
APT=(apt-get -o DPkg::Lock::Timeout=300)
missing=()
for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    "${APT[@]}" update -qq
    DEBIAN_FRONTEND=noninteractive "${APT[@]}" install -y -qq --no-install-recommends "${missing[@]}"
fi
