#!/usr/bin/env bash
# Build the Go components the runtime and cluster tiers and the benchmarks run: containerd
# 2.x (daemon, runc shim, ctr), the reference tuning plugin, etcd, Kubernetes (kube-apiserver, kubelet, kubectl,
# kube-controller-manager, kube-scheduler), Multus (the thin plugin, and multus-daemon +
# multus-shim for thick mode) and cnitool, from the Go module proxy.
#
# Idempotent. Binaries land outside the repo in $PLEXUS_GO_TOOLS (default
# /var/cache/plexus-go-tools) as <name>-<version>/<binary>, with stable symlinks in
# $PLEXUS_GO_TOOLS/bin. A component whose binaries and recipe stamp are present is skipped,
# so a second run takes well under a second; the first run compiles Kubernetes.
#
# Each binary is built from its upstream main package inside a throwaway module that
# requires it: etcd's and Kubernetes' own go.mod files carry `replace` directives, so
# `go install pkg@version` refuses them. For Kubernetes the throwaway module pins every
# k8s.io staging module to the matching published v0.x.y.
set -euo pipefail

ETCD_VERSION=v3.6.16
KUBE_VERSION=v1.37.2
CONTAINERD_VERSION=v2.4.2
CNI_PLUGINS_VERSION=v1.10.0
MULTUS_VERSION=v4.2.4
CNITOOL_VERSION=v1.3.1
GO_MIN=1.26 # etcd v3.6.16's, Kubernetes v1.37.2's and containerd v2.4.2's go.mod say go 1.26

ROOT=${PLEXUS_GO_TOOLS:-/var/cache/plexus-go-tools}
JOBS=${PLEXUS_GO_JOBS:-$(nproc)}

log() { printf 'build-go-tools: %s\n' "$*"; }

command -v go >/dev/null || { log "go not found on PATH (need go >= $GO_MIN)"; exit 1; }
# Static builds with the installed toolchain, never a downloaded one (a component that
# needs more sets GOTOOLCHAIN, CGO_ENABLED or TAGS for its own build() call).
export GOTOOLCHAIN=local CGO_ENABLED=0 GOWORK=off GOFLAGS="-mod=mod -buildvcs=false"
TAGS=""
GOVERSION=$(go env GOVERSION)
if [[ "$(printf '%s\n' "go$GO_MIN" "$GOVERSION" | sort -V | head -1)" != "go$GO_MIN" ]]; then
    log "$GOVERSION is too old (need go >= $GO_MIN)"
    exit 1
fi

mkdir -p "$ROOT/bin"
exec 9>"$ROOT/.lock"
flock 9 # one build at a time per cache dir

WORK=""
cleanup() {
    [[ -z "$WORK" ]] || rm -rf "$WORK"
    WORK=""
}
trap cleanup EXIT

# The go.mod of MODULE@VERSION, downloaded into the module cache.
upstream_gomod() {
    go mod download -json "$1@$2" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p'
}

# No extra replace directives.
no_replaces() { :; }

# Every `k8s.io/X => ./staging/src/k8s.io/X` of k8s.io/kubernetes, pinned to the published
# staging module: Kubernetes v1.X.Y ships them as v0.X.Y.
kube_replaces() {
    local m
    sed -n 's|^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/src/.*|\1|p' "$1" |
        while read -r m; do go mod edit -replace "$m=$m@v0${KUBE_VERSION#v1}"; done
}

# build NAME VERSION MODULE LDFLAGS REPLACES_FN BIN=PKG...
#   MODULE@VERSION provides the packages; REPLACES_FN is called in the throwaway module
#   with upstream's go.mod path; each BIN=PKG builds main package PKG into binary BIN.
#   GOTOOLCHAIN, CGO_ENABLED and TAGS (build tags) given on the call apply to this build.
build() {
    local name=$1 version=$2 module=$3 ldflags=$4 replaces=$5
    shift 5
    local dir="$ROOT/$name-$version" recipe spec missing=0
    recipe="$GOVERSION $module@$version ldflags=[$ldflags] $replaces $*"
    # Only a non-default environment is part of the recipe: the defaults' recipes stay put.
    if [[ "$GOTOOLCHAIN $CGO_ENABLED $TAGS" != "local 0 " ]]; then
        recipe+=" toolchain=$GOTOOLCHAIN cgo=$CGO_ENABLED tags=[$TAGS]"
    fi
    for spec in "$@"; do [[ -x "$dir/${spec%%=*}" ]] || missing=1; done
    if ((missing == 0)) && [[ "$(cat "$dir/.recipe" 2>/dev/null)" == "$recipe" ]]; then
        log "$name $version: cached"
    else
        local start=$SECONDS
        log "$name $version: building (-p $JOBS)"
        WORK=$(mktemp -d "${TMPDIR:-/tmp}/plexus-go-$name.XXXXXX")
        (
            cd "$WORK"
            go mod init "plexus.invalid/build/$name" 2>/dev/null
            gomod=$(upstream_gomod "$module" "$version")
            # Run with the GODEBUG defaults upstream's own go.mod selects.
            go mod edit -godebug "default=go$(sed -n 's/^go \([0-9]*\.[0-9]*\).*/\1/p' "$gomod")"
            "$replaces" "$gomod"
            go get "$module@$version"
            for spec in "$@"; do
                go build -p "$JOBS" -trimpath -tags "$TAGS" -ldflags "-s -w $ldflags" \
                    -o "out/${spec%%=*}" "${spec#*=}"
            done
        )
        mkdir -p "$dir"
        rm -f "$dir/.recipe"
        for spec in "$@"; do mv -f "$WORK/out/${spec%%=*}" "$dir/"; done
        printf '%s\n' "$recipe" >"$dir/.recipe"
        cleanup
        log "$name $version: built in $((SECONDS - start)) s"
    fi
    for spec in "$@"; do ln -sfn "../$name-$version/${spec%%=*}" "$ROOT/bin/${spec%%=*}"; done
}

# What Kubernetes' own build stamps into its binaries (hack/lib/version.sh).
kube_ldflags() {
    local minor=${KUBE_VERSION#v1.} pkg flags=""
    minor=${minor%%.*}
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1"
        flags+=" -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
    done
    printf '%s' "${flags# }"
}

build cnitool "$CNITOOL_VERSION" github.com/containernetworking/cni "" no_replaces \
    cnitool=github.com/containernetworking/cni/cnitool

build multus "$MULTUS_VERSION" gopkg.in/k8snetworkplumbingwg/multus-cni.v4 \
    "-X gopkg.in/k8snetworkplumbingwg/multus-cni.v4/pkg/multus.version=$MULTUS_VERSION" \
    no_replaces multus=gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus

# Thick mode as its own entry, so adding it leaves a cached thin build untouched.
build multus-thick "$MULTUS_VERSION" gopkg.in/k8snetworkplumbingwg/multus-cni.v4 \
    "-X gopkg.in/k8snetworkplumbingwg/multus-cni.v4/pkg/multus.version=$MULTUS_VERSION" \
    no_replaces multus-daemon=gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-daemon \
    multus-shim=gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-shim

build etcd "$ETCD_VERSION" go.etcd.io/etcd/server/v3 "" no_replaces \
    etcd=go.etcd.io/etcd/server/v3

# containerd 2.x for the runtime tier and one node of the two-node tier (Debian's 1.6 runs
# the other). Static like upstream's release binaries; the tag drops the man-page generator.
# Debian's runc runs its containers.
TAGS=urfave_cli_no_docs build containerd "$CONTAINERD_VERSION" github.com/containerd/containerd/v2 \
    "-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" no_replaces \
    containerd=github.com/containerd/containerd/v2/cmd/containerd \
    containerd-shim-runc-v2=github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    ctr=github.com/containerd/containerd/v2/cmd/ctr

# The reference tuning plugin at a version that reads cniVersion 1.1.0 (Debian's 1.1.1 stops
# at 1.0.0): what a containerd 2.x runtime chains after Plexus at 1.1.0.
build cni-plugins "$CNI_PLUGINS_VERSION" github.com/containernetworking/plugins \
    "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION" \
    no_replaces tuning=github.com/containernetworking/plugins/plugins/meta/tuning

build kubernetes "$KUBE_VERSION" k8s.io/kubernetes "$(kube_ldflags)" kube_replaces \
    kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
    kubelet=k8s.io/kubernetes/cmd/kubelet \
    kubectl=k8s.io/kubernetes/cmd/kubectl

# The control loops the two-node tier needs (DaemonSets, service-account tokens, scheduling):
# same module and pinning as the kubelet, in their own cache dir so adding them does not
# rebuild the binaries above (the Go build cache is shared, so most packages are reused).
build kube-controllers "$KUBE_VERSION" k8s.io/kubernetes "$(kube_ldflags)" kube_replaces \
    kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
    kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler

# whereabouts' CNI binary, which Plexus's in-process IPAM is compared with and benchmarked
# against. Its go.mod has replace directives, so `go install pkg@version` refuses it: it is
# built inside a copy of the downloaded module, with the ldflags of upstream's own build.
WHEREABOUTS_VERSION=v0.9.4
build_whereabouts() {
    local module=github.com/k8snetworkplumbingwg/whereabouts version=$WHEREABOUTS_VERSION
    local dir="$ROOT/whereabouts-$version" recipe src start=$SECONDS ldflags
    ldflags="-X $module/pkg/version.Version=$version"
    ldflags+=" -X $module/pkg/version.ReleaseStatus=released"
    recipe="$GOVERSION $module@$version ldflags=[$ldflags] whereabouts=./cmd"
    if [[ -x "$dir/whereabouts" && "$(cat "$dir/.recipe" 2>/dev/null)" == "$recipe" ]]; then
        log "whereabouts $version: cached"
    else
        log "whereabouts $version: building (-p $JOBS)"
        WORK=$(mktemp -d "${TMPDIR:-/tmp}/plexus-go-whereabouts.XXXXXX")
        src=$(go mod download -json "$module@$version" |
            sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
        cp -r "$src" "$WORK/src"
        chmod -R u+w "$WORK/src"
        (cd "$WORK/src" && go build -p "$JOBS" -trimpath -ldflags "-s -w $ldflags" \
            -o "$WORK/whereabouts" ./cmd)
        mkdir -p "$dir"
        rm -f "$dir/.recipe"
        mv -f "$WORK/whereabouts" "$dir/"
        printf '%s\n' "$recipe" >"$dir/.recipe"
        cleanup
        log "whereabouts $version: built in $((SECONDS - start)) s"
    fi
    ln -sfn "../whereabouts-$version/whereabouts" "$ROOT/bin/whereabouts"
}
build_whereabouts

for b in cnitool multus multus-daemon multus-shim whereabouts etcd containerd containerd-shim-runc-v2 ctr \
    tuning kube-apiserver kubelet kubectl kube-controller-manager kube-scheduler; do
    printf '%-15s %s\n' "$b" "$(readlink -f "$ROOT/bin/$b")"
done
