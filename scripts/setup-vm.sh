#!/usr/bin/env bash
# Idempotent setup of the VM test tier (tests/vm): QEMU, a Debian 6.12 kernel with
# ipvlan/8021q/dummy/SR-IOV, a static busybox for virtme's initramfs, virtme-ng in
# .venv-vm, and virtiofsd in /usr/libexec (built once per machine from crates.io; Debian
# 12 has none): with it the guest's root is virtiofs, ~3x faster than 9p under TCG
# (boot + imports ~14 s vs ~40 s). tests/vm/vm.py reads VM_KERNEL from this file.
set -euo pipefail
cd "$(dirname "$0")/.."

VM_KERNEL=6.12.95+deb12-amd64
VNG_VERSION=1.42
VIRTIOFSD_VERSION=1.14.0
VIRTIOFSD=/usr/libexec/virtiofsd # where vng looks for it, as Debian 13 installs it
BPO_LIST=/etc/apt/sources.list.d/bookworm-backports.sources

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# The archive URI of the existing plain `bookworm` suite, deb822 or one-line format.
bookworm_uri() {
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.sources; do
        [[ -f $f ]] || continue
        awk '
            /^[[:space:]]*$/ { if (uri != "" && hit) { print uri; exit } uri = ""; hit = 0; next }
            tolower($1) == "uris:" { uri = $2 }
            tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == "bookworm") hit = 1 }
            $1 == "deb" { for (i = 2; i < NF; i++) if ($i !~ /^\[/ && $(i + 1) == "bookworm") { print $i; exit } }
            END { if (uri != "" && hit) print uri }
        ' "$f"
    done | head -n1
}

have_backports() {
    grep -rqsE '(^|[[:space:]])bookworm-backports([[:space:]]|$)' \
        /etc/apt/sources.list /etc/apt/sources.list.d/
}

apt_updated=0
APT=(apt-get -o DPkg::Lock::Timeout=300) # other setups may hold the lock
apt_update() { ((apt_updated)) || { "${APT[@]}" update -qq && apt_updated=1; }; }

if ! have_backports; then
    uri=$(bookworm_uri)
    [[ -n $uri ]] || { echo "setup-vm: no bookworm entry found in apt sources" >&2; exit 1; }
    echo "setup-vm: adding bookworm-backports from $uri"
    cat >"$BPO_LIST" <<EOF
Types: deb
URIs: $uri
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    apt_update
fi

# One apt call (-t prefers backports, the rest comes from bookworm): each kernel
# package trigger regenerates the initramfs otherwise.
PACKAGES=(qemu-system-x86 "linux-image-$VM_KERNEL" kmod busybox-static)
CARGO=$(command -v cargo || echo "$HOME/.cargo/bin/cargo")
want_virtiofsd=0
if [[ -x $CARGO && $("$VIRTIOFSD" --version 2>/dev/null) != "virtiofsd $VIRTIOFSD_VERSION" ]]; then
    want_virtiofsd=1
    PACKAGES+=(libseccomp-dev libcap-ng-dev pkg-config) # its build dependencies
fi
missing=()
for p in "${PACKAGES[@]}"; do installed "$p" || missing+=("$p"); done
# qemu's igb device (the SR-IOV PF) needs QEMU >= 8: bookworm's 7.2 lacks it.
if installed qemu-system-x86 && [[ $(qemu-system-x86_64 -device help 2>/dev/null) != *'"igb"'* ]]; then
    missing+=(qemu-system-x86)
fi
if ((${#missing[@]})); then
    apt_update
    candidate=$(apt-cache policy "linux-image-$VM_KERNEL" | awk '/Candidate:/ { print $2 }')
    if [[ -z $candidate || $candidate == "(none)" ]]; then
        echo "setup-vm: linux-image-$VM_KERNEL is not in the archive;" \
            "set VM_KERNEL in $0 to one of:" >&2
        apt-cache search --names-only '^linux-image-6\.12\.[0-9]+\+deb12-amd64$' >&2
        exit 1
    fi
    echo "setup-vm: installing ${missing[*]} (bookworm-backports preferred)"
    DEBIAN_FRONTEND=noninteractive "${APT[@]}" install -y -qq --no-install-recommends \
        -t bookworm-backports "${missing[@]}"
fi
test -r "/boot/vmlinuz-$VM_KERNEL"
test -d "/lib/modules/$VM_KERNEL"

if [[ $(.venv-vm/bin/vng --version 2>/dev/null) != "virtme-ng $VNG_VERSION" ]]; then
    echo "setup-vm: installing virtme-ng $VNG_VERSION into .venv-vm"
    PYTHON=$(python3.11 -c 'import sys; print(sys.executable)')
    "$PYTHON" -m venv .venv-vm
    .venv-vm/bin/pip install -q --disable-pip-version-check "virtme-ng==$VNG_VERSION"
fi
test -x .venv-vm/bin/virtme-run

if ((want_virtiofsd)); then
    echo "setup-vm: building virtiofsd $VIRTIOFSD_VERSION into $VIRTIOFSD (~2 min)"
    build=$(mktemp -d)
    "$CARGO" install -q --locked "virtiofsd@$VIRTIOFSD_VERSION" --root "$build"
    install -D -m 0755 "$build/bin/virtiofsd" "$VIRTIOFSD"
    rm -rf "$build"
elif [[ ! -x $VIRTIOFSD ]]; then
    echo "setup-vm: no cargo, so no virtiofsd: the guest's root falls back to 9p (slower)" >&2
fi
rootfs=9p
[[ -x $VIRTIOFSD ]] && rootfs=virtiofs
echo "setup-vm: ok (kernel $VM_KERNEL, $(.venv-vm/bin/vng --version), guest root over $rootfs)"
