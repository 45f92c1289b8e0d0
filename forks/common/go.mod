// Module common holds the files every release's kube-apiserver fork adds to k8s.io/kubernetes
// (files/, at their path in the kubernetes tree). It is a module of its own only so that the
// library's ./... leaves them alone: they compile inside kube-apiserver, where the build of each
// forks/<release> overlays them beside that release's own files (see forks/README.md).
module github.com/kube-ipam/clusterip/forks/common

go 1.24.0
