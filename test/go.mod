module github.com/kube-ipam/clusterip/test

go 1.24.0

require github.com/anishathalye/porcupine v1.3.1

replace github.com/kube-ipam/clusterip => ..
