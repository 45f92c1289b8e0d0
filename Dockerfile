# syntax=docker/dockerfile:1
# The clusterip image for those who build with Docker (or Podman, Buildah, kaniko):
#
#   docker build --build-arg VERSION=v0.1.0 -t ghcr.io/kube-ipam/clusterip:v0.1.0 .
#
# It makes what hack/image.sh makes without a daemon and without pulling a base image: the
# command's slim build (-tags clusterip_slim,grpcnotrace: no demo, no bench, no grpc tracing), static (CGO_ENABLED=0), alone on
# an empty base (scratch) as /clusterip, the entrypoint, run as 65532:65532, with the version
# stamped in (clusterip version prints VERSION) and in the labels. CI does not run this file (it
# has no Docker daemon); .ci/image-check proves hack/image.sh's image, which is the one to push.
# Unlike hack/image.sh's, this image's digest depends on the builder's Go release and the time
# of the build.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=
WORKDIR /src
# The workspace's modules first, so that a change of source does not download them again.
COPY go.work go.work.sum go.mod go.sum ./
COPY cmd/clusterip/go.mod cmd/clusterip/go.sum cmd/clusterip/
COPY test/go.mod test/go.sum test/
COPY internal/localcluster/etcdserver/go.mod internal/localcluster/etcdserver/go.sum internal/localcluster/etcdserver/
RUN --mount=type=cache,target=/go/pkg/mod \
	cd cmd/clusterip && go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
	cd cmd/clusterip && CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
	go build -buildvcs=false -trimpath -tags clusterip_slim,grpcnotrace \
		-ldflags "-s -w -X main.stampedVersion=${VERSION}" -o /out/clusterip .

FROM scratch
ARG VERSION=
LABEL org.opencontainers.image.title=clusterip \
	org.opencontainers.image.source=https://github.com/kube-ipam/clusterip \
	org.opencontainers.image.licenses=Apache-2.0 \
	org.opencontainers.image.version=${VERSION}
COPY --from=build /out/clusterip /clusterip
USER 65532:65532
ENTRYPOINT ["/clusterip"]
