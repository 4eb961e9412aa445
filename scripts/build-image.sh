#!/usr/bin/env bash
# Build the Plexus image from the repo's Containerfile with no registry, for the tests.
#
#   scripts/build-image.sh [IMAGE]     (default IMAGE: localhost/plexus:dev)
#
# Prints one line on stdout: the path of a docker-archive tarball holding IMAGE, ready for
# `ctr -n k8s.io images import`. Everything else goes to stderr.
#
# The base (the Containerfile's BASE argument, python:3.11-slim for users) is made from
# Debian packages with mmdebstrap; buildah (--isolation chroot, its own storage) builds the
# Containerfile on it, fetching the Python packages from PyPI. All of it is cached in
# $PLEXUS_IMAGE_CACHE (default /var/cache/plexus-image), keyed by a hash of the inputs:
# an unchanged tree gives its archive back at once, another IMAGE name for the same tree
# (an upgrade test's second tag) only re-tags it.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${1:-localhost/plexus:dev}
CACHE=${PLEXUS_IMAGE_CACHE:-/var/cache/plexus-image}
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
BASE_PACKAGES=python3,python3-venv,ca-certificates
HOST_CA=${PLEXUS_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}
BUILDAH=(buildah --root "$CACHE/storage" --runroot "$CACHE/run" --storage-driver overlay)

for tool in buildah mmdebstrap; do
    command -v "$tool" >/dev/null || { echo "build-image: $tool missing (run make setup)" >&2; exit 1; }
done
mkdir -p "$CACHE/archives"
exec 9>"$CACHE/lock"
flock 9 # one build at a time; a second caller waits, then finds the cache filled

started=$(date +%s%N)
elapsed() {
    local tenths=$((($(date +%s%N) - started) / 100000000))
    echo "$((tenths / 10)).$((tenths % 10))"
}

base_key=$(echo "$SUITE $MIRROR $BASE_PACKAGES" | sha256sum | cut -c1-16)
base=localhost/plexus-base:$base_key
if ! "${BUILDAH[@]}" inspect --type image "$base" >/dev/null 2>&1; then
    echo "build-image: making the base $base from Debian $SUITE (mmdebstrap)" >&2
    tarball="$CACHE/base-$base_key.tar"
    mmdebstrap --quiet --format=tar --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$tarball.tmp" "$MIRROR" >&2
    mv "$tarball.tmp" "$tarball"
    ctr=$("${BUILDAH[@]}" from --quiet scratch)
    "${BUILDAH[@]}" add --quiet "$ctr" "$tarball" / >&2
    "${BUILDAH[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
    "${BUILDAH[@]}" commit --quiet --rm "$ctr" "$base" >&2
    rm -f "$tarball"
fi

# The build context: only what the Containerfile copies (as .dockerignore says), so the
# key changes with exactly those files.
context=$(mktemp -d "$CACHE/context.XXXXXX")
trap 'rm -rf "$context"' EXIT
tar -c --exclude=__pycache__ --exclude='*_pb2.py' --exclude='*_pb2.pyi' --exclude='*_pb2_grpc.py' \
    Containerfile pyproject.toml scripts/gen-protos.py cni kube meta delegates deviceplugin |
    tar -x -C "$context"
# The package metadata needs a README but the image does not need the docs: a stub keeps
# README edits from rebuilding the image.
echo "Plexus: see README.md in the repository." >"$context/README.md"
key=$({
    echo "$base_key"
    tar -c -C "$context" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner .
} | sha256sum | cut -c1-16)
built=localhost/plexus-build:$key
archive="$CACHE/archives/$key-$(echo "$IMAGE" | tr -c 'A-Za-z0-9._\n-' '_').tar"

if [[ -f "$archive" ]]; then
    echo "build-image: $IMAGE cached ($key, $(elapsed) s)" >&2
    echo "$archive"
    exit 0
fi
if ! "${BUILDAH[@]}" inspect --type image "$built" >/dev/null 2>&1; then
    echo "build-image: building $built on $base" >&2
    # pip in the build trusts this machine's CA bundle (PyPI may be reached through a TLS
    # proxy whose CA only the host has), through a pip.conf mounted for the RUN steps only.
    printf '[global]\ncert = /etc/plexus-build-ca.crt\n' >"$CACHE/pip.conf"
    "${BUILDAH[@]}" build --quiet --isolation chroot --layers --pull-never \
        --volume "$CACHE/pip.conf:/etc/pip.conf:ro" --volume "$HOST_CA:/etc/plexus-build-ca.crt:ro" \
        --build-arg BASE="$base" -f Containerfile -t "$built" "$context" >&2
fi
"${BUILDAH[@]}" push --quiet "$built" "docker-archive:$archive.tmp:$IMAGE" >&2
mv "$archive.tmp" "$archive"
find "$CACHE/archives" -name '*.tar' -mtime +1 -delete # other trees' images, a day old
echo "build-image: $IMAGE built ($key, $(elapsed) s)" >&2
echo "$archive"
