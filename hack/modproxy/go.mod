module github.com/kube-ipam/clusterip/hack/modproxy

go 1.24.0

require golang.org/x/mod v0.29.0
