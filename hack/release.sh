#!/usr/bin/env bash
# Releases clusterip at a version: makes the release commit, proves `go install …@version` from
# it before anything is pushed, and tags it. It never touches the working tree or a branch.
#
#   hack/release.sh [-n] [-rev REV] [-proxy DIR] vX.Y.Z
#
# The repository publishes three modules at one version, all from one commit:
#   the library                          github.com/kube-ipam/clusterip                                  tag vX.Y.Z
#   the etcd server the command embeds   github.com/kube-ipam/clusterip/internal/localcluster/etcdserver  tag internal/localcluster/etcdserver/vX.Y.Z
#   the command                          github.com/kube-ipam/clusterip/cmd/clusterip                    tag cmd/clusterip/vX.Y.Z
# (test/, forks/, internal/kubeapiserver*/ and hack/modproxy are modules that are never published.)
# On main the command's go.mod replaces the other two with their directories, which
# `go install …@version` refuses, so the release commit is main's commit (REV, default HEAD) with
# cmd/clusterip/go.mod and go.sum changed (no replace, and both siblings required at vX.Y.Z) and
# the image tag of deploy/'s kustomizations set to vX.Y.Z,
# with go.sum lines whose hashes are computed from REV's files as the module proxy will compute
# them from the tags (hack/modproxy). The commit is made with git plumbing (a temporary index, no
# checkout) and is on no branch: the tags keep it.
#
# Steps: publish the library and the etcd server at vX.Y.Z into a file-based module proxy in a
# temporary directory; in a scratch copy of cmd/clusterip, drop the replaces, require vX.Y.Z and
# `go mod tidy` from that proxy; commit; publish the command too; `go install
# github.com/kube-ipam/clusterip/cmd/clusterip@vX.Y.Z` with no workspace, from outside the
# repository, our modules from that proxy only (the others from `go env GOPROXY`), and check that
# its `version` verb prints vX.Y.Z; then tag, and print the `git push` that publishes.
#
#   -n          check only: no tags (the commit is left dangling). .ci/install-check runs this.
#   -rev REV    the commit to release (default HEAD).
#   -proxy DIR  publish into DIR and keep it, rather than into a temporary directory.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

usage() { echo "usage: hack/release.sh [-n] [-rev REV] [-proxy DIR] vX.Y.Z" >&2; exit 2; }
dry=false rev=HEAD proxy=
while [ $# -gt 0 ]; do
	case $1 in
	-n) dry=true ;;
	-rev) [ $# -ge 2 ] || usage; rev=$2; shift ;;
	-proxy) [ $# -ge 2 ] || usage; proxy=$2; shift ;;
	-*) usage ;;
	*) break ;;
	esac
	shift
done
[ $# -eq 1 ] || usage
version=$1
# The modules' paths have no /vN suffix, so only v0 and v1 versions are theirs.
if ! [[ $version =~ ^v[01]\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]]; then
	echo "release: $version: want vX.Y.Z or vX.Y.Z-pre with X 0 or 1 (the module paths have no /vN suffix)" >&2
	exit 2
fi

lib=github.com/kube-ipam/clusterip
etcdserver=$lib/internal/localcluster/etcdserver
cmd=$lib/cmd/clusterip
tags=("$version" "internal/localcluster/etcdserver/$version" "cmd/clusterip/$version")
if ! $dry; then
	for t in "${tags[@]}"; do
		if git rev-parse -q --verify "refs/tags/$t" >/dev/null; then
			echo "release: tag $t exists already" >&2
			exit 1
		fi
	done
fi

# A check (-n) commits without asking who you are: CI clones have no git identity.
if $dry && [ -z "$(git config user.email || true)" ]; then
	export GIT_AUTHOR_NAME=clusterip-release GIT_AUTHOR_EMAIL=release@clusterip.invalid
	export GIT_COMMITTER_NAME=$GIT_AUTHOR_NAME GIT_COMMITTER_EMAIL=$GIT_AUTHOR_EMAIL
fi

modcache=$(go env GOMODCACHE)
uncache() {
	# Take the modules at $version out of the module cache again (-modcacherw below makes them
	# removable), and out of its version lists: a check's version is a throwaway, and a release
	# is fetched from the proxy once pushed (one not pushed and made again must not meet these).
	for m in "$lib" "$etcdserver" "$cmd"; do
		chmod -R u+w "$modcache/$m@$version" 2>/dev/null || true
		rm -rf "$modcache/$m@$version" "$modcache/cache/download/$m/@v/$version".*
		list=$modcache/cache/download/$m/@v/list
		if [ -f "$list" ]; then
			grep -vxF "$version" "$list" >"$list.tmp" || true
			if [ -s "$list.tmp" ]; then mv "$list.tmp" "$list"; else rm -f "$list.tmp" "$list"; fi
		fi
	done
	find "$modcache/github.com/kube-ipam" "$modcache/cache/download/github.com/kube-ipam" -depth -type d -empty -delete 2>/dev/null || true
}
cleanup() {
	uncache
	rm -rf "$tmp"
}
# Runs at one version take turns, and each starts from a module cache without that version: one
# left by a run that was killed would be used in place of what this run publishes. (A version
# must never be published with other files: the go command's module index of the module cache
# is keyed by the directory, module@version, and would list the old files' imports.)
exec 9>"${TMPDIR:-/tmp}/clusterip-release-$version.lock"
flock 9
uncache
tmp=$(mktemp -d "${TMPDIR:-/tmp}/clusterip-release.XXXXXX")
trap cleanup EXIT
[ -n "$proxy" ] || proxy=$tmp/proxy
mkdir -p "$proxy"
proxy=$(cd "$proxy" && pwd)

base=$(git rev-parse --verify "$rev^{commit}")
echo "release $version of $base ($(git log -1 --format=%s "$base"))"

# Our modules come from the local proxy only; the rest as `go env GOPROXY` says. No checksum
# database knows our test versions (nor a release's, until it is pushed). GOPRIVATE would also
# set GONOPROXY, which sends our modules to github.com instead of the proxy: clear both.
goproxy() {
	env GOWORK=off GOPROXY="file://$proxy,$(go env GOPROXY)" GONOSUMDB=$lib GOPRIVATE= GONOPROXY= \
		GOTOOLCHAIN=local GOFLAGS="$(go env GOFLAGS) -modcacherw" "$@"
}

(cd hack/modproxy && GOWORK=off go build -o "$tmp/modproxy" .)
"$tmp/modproxy" -repo "$root" -rev "$base" -version "$version" -dir "$proxy" . internal/localcluster/etcdserver

# The command's module at the release: no replace, its siblings at $version, go.sum from the proxy.
mkdir -p "$tmp/src"
git archive "$base" cmd/clusterip | tar -x -C "$tmp/src"
(
	cd "$tmp/src/cmd/clusterip"
	go mod edit -dropreplace=$lib -dropreplace=$etcdserver -require=$lib@$version -require=$etcdserver@$version
	goproxy go mod tidy
	if grep -q '^replace\|=>' go.mod; then
		echo "release: cmd/clusterip/go.mod still replaces a module" >&2
		exit 1
	fi
)

# The kustomizations that name the image (the webhook base and the check CronJob example) pull
# the release's own: their newTag becomes $version.
kustomizations=(deploy/webhook/kustomization.yaml deploy/examples/check-cronjob/kustomization.yaml)
for k in "${kustomizations[@]}"; do
	mkdir -p "$tmp/src/$(dirname "$k")"
	git show "$base:$k" | sed "s/^\(    newTag: \).*\$/\1$version/" >"$tmp/src/$k"
	if ! grep -qx "    newTag: $version" "$tmp/src/$k"; then
		echo "release: $k: no image newTag to set to $version" >&2
		exit 1
	fi
done

# The release commit: $base with the command's go.mod and go.sum and the kustomizations' image
# tags changed (a temporary index).
export GIT_INDEX_FILE=$tmp/index
git read-tree "$base"
for f in cmd/clusterip/go.mod cmd/clusterip/go.sum "${kustomizations[@]}"; do
	blob=$(git hash-object -w "$tmp/src/$f")
	git update-index --cacheinfo "100644,$blob,$f"
done
tree=$(git write-tree)
unset GIT_INDEX_FILE
release=$(git commit-tree "$tree" -p "$base" -m "release $version

cmd/clusterip requires $lib and $etcdserver at $version,
with no replace directive, so that go install $cmd@$version works;
deploy/ pulls the image ghcr.io/kube-ipam/clusterip:$version.")
git diff --stat "$base" "$release"
for k in "${kustomizations[@]}"; do
	if ! git show "$release:$k" | grep -qx "    newTag: $version"; then
		echo "release: the release commit's $k does not pull the image at $version" >&2
		exit 1
	fi
done
"$tmp/modproxy" -repo "$root" -rev "$release" -version "$version" -dir "$proxy" cmd/clusterip

# go install as a user runs it: no workspace, outside the repository.
mkdir -p "$tmp/bin" "$tmp/home"
start=$(date +%s)
(cd "$tmp/home" && goproxy GOBIN="$tmp/bin" go install "$cmd@$version")
echo "go install $cmd@$version: $(($(date +%s) - start)) s"
if go version -m "$tmp/bin/clusterip" | grep -E "^\s+(dep|mod)\s+$lib" | grep -v "\s$version\s" ; then
	echo "release: the installed binary has a module of ours at another version, or replaced (above)" >&2
	exit 1
fi
got=$("$tmp/bin/clusterip" version -o json | sed -n 's/^  "clusteripVersion": "\(.*\)",*$/\1/p')
if [ "$got" != "$version" ]; then
	echo "release: clusterip version printed clusteripVersion \"$got\", want $version:" >&2
	"$tmp/bin/clusterip" version -o json >&2
	exit 1
fi
"$tmp/bin/clusterip" version

if $dry; then
	echo "check passed; release commit $release (dangling, no tags made)"
	exit 0
fi
for t in "${tags[@]}"; do
	git tag -a -m "clusterip $version" "$t" "$release"
done
echo "tagged $release as ${tags[*]}; publish with:"
echo "  git push origin ${tags[*]}"
