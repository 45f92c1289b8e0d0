#!/usr/bin/env bash
# Writes the nested module internal/kubeapiserver/<release> that builds stock kube-apiserver of
# that release: it requires k8s.io/kubernetes at the release, replaces each staging module it
# names (k8s.io/api, k8s.io/apiserver, …) by the published v0.<minor>.<patch> of the same release,
# copies the release's go and godebug lines, and lets "go mod tidy" pin every other module at what
# the release's own go.mod says. Run it once per new release, then commit go.mod and go.sum:
#
#	internal/kubeapiserver/new-release.sh v1.37.2
#
# A pre-release works the same way: v1.38.0-beta.0's staging modules are v0.38.0-beta.0. A release
# whose go line is newer than the Go at hand needs a toolchain that the module proxy serves (as
# golang.org/toolchain), named by $TOOLCHAIN: the script runs go with it and writes it as the
# module's toolchain line, which the build (internal/localcluster) then runs the module's go
# commands with; the library's own module keeps building with the Go at hand:
#
#	TOOLCHAIN=go1.27.3 internal/kubeapiserver/new-release.sh v1.38.0-beta.0
set -euo pipefail
rel=${1:?usage: new-release.sh v1.N.P[-beta.K]}
[[ $rel =~ ^v1\.([0-9]+)\.([0-9]+)(-(alpha|beta|rc)\.[0-9]+)?$ ]] ||
	{ echo "new-release.sh: $rel is not a release like v1.37.2 or v1.38.0-beta.0" >&2; exit 2; }
staging=v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}${BASH_REMATCH[3]}
cd "$(dirname "$0")"
export GOWORK=off GOFLAGS=
if [ -n "${TOOLCHAIN:-}" ]; then
	export GOTOOLCHAIN=$TOOLCHAIN
fi
src=$(go mod download -json "k8s.io/kubernetes@$rel" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
[ -n "$src" ] || { echo "new-release.sh: cannot download k8s.io/kubernetes@$rel" >&2; exit 1; }
mkdir -p "$rel"
{
	echo "// Module $rel builds stock kube-apiserver $rel for the integration tests (written by ../new-release.sh)."
	echo "// It is a separate module so that k8s.io/kubernetes never enters the library's module graph."
	echo "module github.com/kube-ipam/clusterip/internal/kubeapiserver/$rel"
	echo
	grep -E '^go [0-9]' "$src"
	echo
	if [ -n "${TOOLCHAIN:-}" ]; then
		echo
		echo "toolchain $TOOLCHAIN"
	fi
	echo
	grep -E '^godebug ' "$src" || true
	echo
	echo "tool k8s.io/kubernetes/cmd/kube-apiserver"
	echo
	echo "require k8s.io/kubernetes $rel"
	echo
	echo "replace ("
	sed -n 's|^\t\(k8s\.io/[a-z0-9-]*\) => \./staging/src/.*$|\t\1 => \1 '"$staging"'|p' "$src"
	echo ")"
} >"$rel/go.mod"
(cd "$rel" && go mod tidy)
