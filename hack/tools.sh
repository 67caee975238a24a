#!/usr/bin/env bash
# Builds the tools that the Makefile and the test suites use into bin/, from Go modules.
#
# Each tool is built once per version into a per-user cache outside the checkout
# (${TOKENWARDEN_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tokenwarden}/TOOL/VERSION/TOOL)
# and linked into bin/, so a fresh clone on the same machine reuses what an earlier
# clone built. A tool is rebuilt only when its cached binary for the pinned version is
# missing. Nothing here downloads a binary: setup-envtest's download cannot work on
# machines without general network access, and these builds replace it.
#
# Usage: hack/tools.sh [TOOL...]   (default: all tools)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin="$root/bin"
cache="${TOKENWARDEN_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tokenwarden}"
toolsmod="$root/hack/tools"

CONTROLLER_TOOLS_VERSION=v0.23.0
HELM_VERSION=v3.22.0
GOLANGCI_LINT_VERSION=v2.15.0
# The control plane comes from the Kubernetes module that hack/tools/go.mod pins, and
# etcd from the version that module graph selects.
KUBERNETES_VERSION=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$toolsmod/go.mod")
ETCD_VERSION=$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2; exit}' "$toolsmod/go.mod")

log() { printf '[tools] %s\n' "$*" >&2; }

# kube_ldflags stamps the Kubernetes version into a binary, so that kubectl and the API
# server report v1.37.x and kubectl does not warn about version skew.
kube_ldflags() {
	local v=${KUBERNETES_VERSION#v} pkg=k8s.io/component-base/version
	local major=${v%%.*} rest=${v#*.}
	local minor=${rest%%.*}
	printf -- '-s -w -X %s.gitVersion=%s -X %s.gitMajor=%s -X %s.gitMinor=%s -X %s.gitTreeState=clean' \
		"$pkg" "$KUBERNETES_VERSION" "$pkg" "$major" "$pkg" "$minor" "$pkg"
}

# build_tool NAME VERSION: builds NAME at VERSION into the cache (when missing) and
# links it into bin/.
build_tool() {
	local name=$1 version=$2
	local dir="$cache/$name/$version"
	local target="$dir/$name"
	if [[ ! -x "$target" ]]; then
		local start=$SECONDS tmp
		mkdir -p "$dir"
		tmp=$(mktemp -d "$dir/.build.XXXXXX")
		log "building $name $version (cached in $dir)"
		case "$name" in
		kube-apiserver)
			(cd "$toolsmod" && go build -trimpath -ldflags "$(kube_ldflags)" -o "$tmp/$name" k8s.io/kubernetes/cmd/kube-apiserver) ;;
		kubectl)
			(cd "$toolsmod" && go build -trimpath -ldflags "$(kube_ldflags)" -o "$tmp/$name" k8s.io/kubernetes/cmd/kubectl) ;;
		etcd)
			(cd "$toolsmod" && go build -trimpath -ldflags "-s -w" -o "$tmp/$name" ./etcd) ;;
		controller-gen)
			GOBIN="$tmp" go install -trimpath "sigs.k8s.io/controller-tools/cmd/controller-gen@$version" ;;
		helm)
			GOBIN="$tmp" go install -trimpath "helm.sh/helm/v3/cmd/helm@$version" ;;
		golangci-lint)
			GOBIN="$tmp" go install -trimpath "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$version" ;;
		*)
			log "unknown tool $name"; return 2 ;;
		esac
		mv "$tmp/$name" "$target"
		rm -rf "$tmp"
		log "built $name $version in $((SECONDS - start))s"
	fi
	mkdir -p "$bin"
	if [[ "$(readlink "$bin/$name" 2>/dev/null)" != "$target" ]]; then
		ln -sfn "$target" "$bin/$name"
	fi
}

version_of() {
	case "$1" in
	kube-apiserver | kubectl) echo "$KUBERNETES_VERSION" ;;
	etcd) echo "$ETCD_VERSION" ;;
	controller-gen) echo "$CONTROLLER_TOOLS_VERSION" ;;
	helm) echo "$HELM_VERSION" ;;
	golangci-lint) echo "$GOLANGCI_LINT_VERSION" ;;
	*) log "unknown tool $1"; return 2 ;;
	esac
}

tools=("$@")
if [[ ${#tools[@]} -eq 0 ]]; then
	tools=(controller-gen etcd kubectl kube-apiserver helm golangci-lint)
fi
for t in "${tools[@]}"; do
	build_tool "$t" "$(version_of "$t")"
done
