#!/usr/bin/env bash
# Builds the clusterip container image into DIR, with no Docker daemon and no base image pulled:
#
#   hack/image.sh [-version V] [-repository R] [-arch ARCH] DIR
#
# The binary is the command's slim build (-tags clusterip_slim,grpcnotrace: no demo, no bench, so no etcd
# server and no plotting code), static (CGO_ENABLED=0), for linux/ARCH (default: go env GOARCH),
# built with -trimpath -ldflags "-s -w" and its version stamped in (clusterip version prints V).
# hack/image, a module of its own (go-containerregistry stays out of the library's and the
# command's go.mod), puts it on an empty base as /clusterip, the entrypoint, run as 65532:65532,
# labelled org.opencontainers.image.version=V and .source, .revision, and writes
#   DIR/oci            an OCI image layout:  skopeo copy oci:DIR/oci:V docker://R:V
#                                            (or crane push DIR/oci R:V, podman load -i DIR/oci)
#   DIR/clusterip.tar  a tarball tagged R:V:  docker load -i DIR/clusterip.tar
#
# R defaults to ghcr.io/kube-ipam/clusterip. V defaults to the release the commit is tagged with
# (cmd/clusterip/vX.Y.Z, which hack/release.sh makes), else a pseudo-version of HEAD
# (v0.0.0-<commit time>-<commit>, "-dirty" added when the work tree has uncommitted changes,
# which the image includes). The image's times are SOURCE_DATE_EPOCH, else the Unix epoch: the
# same binary makes the same digest. The Dockerfile at the root builds the same image with Docker.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

usage() { echo "usage: hack/image.sh [-version V] [-repository R] [-arch ARCH] DIR" >&2; exit 2; }
version= repository=ghcr.io/kube-ipam/clusterip arch=$(go env GOARCH)
while [ $# -gt 0 ]; do
	case $1 in
	-version) [ $# -ge 2 ] || usage; version=$2; shift ;;
	-repository) [ $# -ge 2 ] || usage; repository=$2; shift ;;
	-arch) [ $# -ge 2 ] || usage; arch=$2; shift ;;
	-*) usage ;;
	*) break ;;
	esac
	shift
done
[ $# -eq 1 ] || usage
mkdir -p "$1"
dir=$(cd "$1" && pwd)

revision=$(git rev-parse HEAD 2>/dev/null || true)
if [ -z "$version" ]; then
	if tag=$(git describe --exact-match --tags --match 'cmd/clusterip/v*' HEAD 2>/dev/null); then
		version=${tag#cmd/clusterip/}
	elif [ -n "$revision" ]; then
		version=v0.0.0-$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S HEAD)-${revision:0:12}
		[ -z "$(git status --porcelain --untracked-files=no)" ] || version=$version-dirty
	else
		echo "image: no git revision to name the image after; give -version" >&2
		exit 2
	fi
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/clusterip-image.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# The workspace (go.work) builds the command from this work tree's library.
(cd cmd/clusterip && CGO_ENABLED=0 GOOS=linux GOARCH=$arch \
	go build -trimpath -tags clusterip_slim,grpcnotrace -ldflags "-s -w -X main.stampedVersion=$version" \
	-o "$tmp/clusterip" .)
echo "binary: $(($(stat -c %s "$tmp/clusterip") / 1000000)) MB (linux/$arch, slim, static, stripped)"
(cd hack/image && GOWORK=off go run . build -binary "$tmp/clusterip" -version "$version" \
	-repository "$repository" -revision "$revision" -platform "linux/$arch" -dir "$dir")
