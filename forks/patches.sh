#!/usr/bin/env bash
# The whole change of each fork as one patch file, and its check.
#
#	forks/patches.sh make v1.37.2    # (re)writes forks/v1.37.2/v1.37.2-clusterip.patch
#	forks/patches.sh check           # every forks/v*/, or the releases named
#	forks/patches.sh module v1.37.2  # writes forks/v1.37.2/go.mod and go.sum for a new release
#	TOOLCHAIN=go1.27.3 forks/patches.sh module v1.38.0-beta.0  # a pre-release that needs a newer Go
#
# "module" writes the build module of a new release's fork: it requires k8s.io/kubernetes at the
# release and the library (replaced by this checkout), replaces each staging module the release
# names by its published v0.<minor>.<patch>, copies the release's go and godebug lines, and lets
# "go mod tidy" pin everything else at what the release's go.mod says, plus what files/ imports.
# A pre-release's staging modules are v0.<minor>.<patch>-<pre> (v0.38.0-beta.0). With $TOOLCHAIN
# (a release whose go line is newer than the Go at hand) it runs go with that toolchain and writes
# it as the module's toolchain line, which every later go command in the module (this script's,
# and the build's, see internal/localcluster) runs.
#
# "make" builds the whole change from what the build applies, forks/<release>/patches/*.patch (the
# upstream files changed), forks/common/files/ (the files every release adds, at their path in the
# kubernetes tree) and forks/<release>/files/ (the files only that release adds), as "git diff"
# writes it, new files included, so that "git apply" takes it in a
# kubernetes checkout at that tag.
#
# "check" copies the module source of each release (k8s.io/kubernetes@<release> from the module
# cache, downloaded if missing) to a temporary directory, runs "git init" and
# "git apply --check" of the whole-change patch there, and checks that "make" would write the
# committed patch again, so that the patch a fork maintainer applies is the one the build and the
# tests use. It needs go and git, and no network once the module is in the cache.
set -euo pipefail
forks=$(cd "$(dirname "$0")" && pwd)
export GOWORK=off GOFLAGS=

# toolchain prints the toolchain line of forks/$1/go.mod, if it has one.
toolchain() {
	sed -n 's/^toolchain \(go[0-9.a-z]*\)$/\1/p' "$forks/$1/go.mod"
}

# pristine prints the module cache directory of k8s.io/kubernetes@$1, downloading it if needed.
pristine() {
	local tc
	tc=$(toolchain "$1")
	(cd "$forks/$1" && GOTOOLCHAIN=${tc:-${GOTOOLCHAIN:-}} go mod download -json "k8s.io/kubernetes@$1") | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'
}

# whole prints the whole-change patch of release $1 built from its patches and files.
whole() {
	local rel=$1 dir=$forks/$1 src tmp p f
	src=$(pristine "$rel")
	[ -n "$src" ] || { echo "patches.sh: cannot download k8s.io/kubernetes@$rel" >&2; return 1; }
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' RETURN
	# Only the files the patches change: the diff of the whole tree is the same.
	for p in "$dir"/patches/*.patch; do
		f=$(sed -n 's|^+++ b/||p' "$p" | head -1)
		mkdir -p "$tmp/$(dirname "$f")"
		cp "$src/$f" "$tmp/$f"
	done
	chmod -R u+w "$tmp"
	local git=(git -C "$tmp" -c user.name=patches.sh -c user.email=patches.sh@invalid -c core.autocrlf=false
		-c diff.noprefix=false -c diff.mnemonicPrefix=false -c diff.relative=false -c core.quotePath=false)
	"${git[@]}" init -q
	"${git[@]}" add -A
	"${git[@]}" commit -q --no-verify -m "k8s.io/kubernetes@$rel"
	"${git[@]}" apply "$dir"/patches/*.patch
	cp -R "$forks/common/files/." "$tmp/"
	cp -R "$dir/files/." "$tmp/"
	"${git[@]}" add -A
	cat <<-HEADER
	The kube-apiserver $rel fork on github.com/kube-ipam/clusterip: its whole change to kubernetes
	at tag $rel, new files included. Apply it in a kubernetes checkout at that tag with
	
	    git apply $rel-clusterip.patch
	
	then add the module as forks/$rel/README.md says. Written by forks/patches.sh from
	forks/$rel/patches, forks/common/files and forks/$rel/files; do not edit.
	
	HEADER
	"${git[@]}" diff --cached --no-color --no-ext-diff --no-renames
}

# module writes forks/$1/go.mod and go.sum.
module() {
	local rel=$1 gomod
	[[ $rel =~ ^v1\.([0-9]+)\.([0-9]+)(-(alpha|beta|rc)\.[0-9]+)?$ ]] ||
		{ echo "patches.sh: $rel is not a release like v1.37.2 or v1.38.0-beta.0" >&2; return 2; }
	local staging=v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}${BASH_REMATCH[3]}
	if [ -n "${TOOLCHAIN:-}" ]; then
		local GOTOOLCHAIN=$TOOLCHAIN
		export GOTOOLCHAIN
	fi
	gomod=$(cd "$forks" && go mod download -json "k8s.io/kubernetes@$rel" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
	[ -n "$gomod" ] || { echo "patches.sh: cannot download k8s.io/kubernetes@$rel" >&2; return 1; }
	mkdir -p "$forks/$rel"
	{
		echo "// Module $rel builds the kube-apiserver $rel fork whose Service ClusterIP allocators are"
		echo "// clusterip's, from the pristine k8s.io/kubernetes module plus patches/ and files/ (see README.md):"
		echo "// its requirements are those of kube-apiserver and of files/, the versions a fork at $rel ends"
		echo "// up with. It is a separate module so that k8s.io/kubernetes never enters the library's module graph."
		echo "module github.com/kube-ipam/clusterip/forks/$rel"
		echo
		grep -E '^go [0-9]' "$gomod"
		if [ -n "${TOOLCHAIN:-}" ]; then
			echo
			echo "toolchain $TOOLCHAIN"
		fi
		echo
		grep -E '^godebug ' "$gomod" || true
		echo
		echo "tool k8s.io/kubernetes/cmd/kube-apiserver"
		echo
		echo "require ("
		echo "	github.com/kube-ipam/clusterip v0.0.0"
		echo "	k8s.io/kubernetes $rel"
		echo ")"
		echo
		echo "replace github.com/kube-ipam/clusterip => ../.."
		echo
		echo "replace ("
		sed -n 's|^\t\(k8s\.io/[a-z0-9-]*\) => \./staging/src/.*$|\t\1 => \1 '"$staging"'|p' "$gomod"
		echo ")"
	} >"$forks/$rel/go.mod"
	(cd "$forks/$rel" && go mod tidy)
	echo "wrote forks/$rel/go.mod and go.sum"
}

cmd=${1:-}
shift || true
case $cmd in
module)
	[ $# -gt 0 ] || { echo "usage: patches.sh module <release>..." >&2; exit 2; }
	for rel in "$@"; do module "$rel"; done
	;;
make)
	[ $# -gt 0 ] || { echo "usage: patches.sh make <release>..." >&2; exit 2; }
	for rel in "$@"; do
		whole "$rel" >"$forks/$rel/$rel-clusterip.patch.tmp"
		mv "$forks/$rel/$rel-clusterip.patch.tmp" "$forks/$rel/$rel-clusterip.patch"
		echo "wrote forks/$rel/$rel-clusterip.patch"
	done
	;;
check)
	rels=("$@")
	if [ ${#rels[@]} -eq 0 ]; then
		for d in "$forks"/v*/; do rels+=("$(basename "$d")"); done
	fi
	status=0
	for rel in "${rels[@]}"; do
		patch=$forks/$rel/$rel-clusterip.patch
		if ! cmp -s "$patch" <(whole "$rel"); then
			echo "forks/$rel: $rel-clusterip.patch is not what forks/$rel/patches and files make: run forks/patches.sh make $rel" >&2
			status=1
			continue
		fi
		src=$(pristine "$rel")
		tmp=$(mktemp -d)
		cp -R "$src/." "$tmp/"
		chmod -R u+w "$tmp"
		git -C "$tmp" init -q
		if git -C "$tmp" apply --check "$patch"; then
			echo "forks/$rel: $rel-clusterip.patch applies to k8s.io/kubernetes@$rel ($(grep -c '^diff --git' "$patch") files)"
		else
			echo "forks/$rel: $rel-clusterip.patch does not apply to k8s.io/kubernetes@$rel" >&2
			status=1
		fi
		rm -rf "$tmp"
	done
	exit $status
	;;
*)
	echo "usage: patches.sh make <release>... | check [<release>...] | module <release>..." >&2
	exit 2
	;;
esac
