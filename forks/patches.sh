#!/usr/bin/env bash
# The whole change of each fork as one patch file, and its check.
#
#	forks/patches.sh make v1.37.2    # (re)writes forks/v1.37.2/v1.37.2-clusterip.patch
#	forks/patches.sh check           # every forks/v*/, or the releases named
#
# "make" builds the whole change from what the build applies, forks/<release>/patches/*.patch (the
# upstream files changed) and forks/<release>/files/ (the files added, at their path in the
# kubernetes tree), as "git diff" writes it, new files included, so that "git apply" takes it in a
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

# pristine prints the module cache directory of k8s.io/kubernetes@$1, downloading it if needed.
pristine() {
	(cd "$forks/$1" && go mod download -json "k8s.io/kubernetes@$1") | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'
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
	cp -R "$dir/files/." "$tmp/"
	"${git[@]}" add -A
	cat <<-HEADER
	The kube-apiserver $rel fork on github.com/kube-ipam/clusterip: its whole change to kubernetes
	at tag $rel, new files included. Apply it in a kubernetes checkout at that tag with
	
	    git apply $rel-clusterip.patch
	
	then add the module as forks/$rel/README.md says. Written by forks/patches.sh from
	forks/$rel/patches and forks/$rel/files; do not edit.
	
	HEADER
	"${git[@]}" diff --cached --no-color --no-ext-diff --no-renames
}

cmd=${1:-}
shift || true
case $cmd in
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
	echo "usage: patches.sh make <release>... | check [<release>...]" >&2
	exit 2
	;;
esac
