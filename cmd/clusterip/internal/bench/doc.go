// Package bench measures the clusterip library's allocators over range sizes and fill levels
// for the clusterip command: one AllocateNext+Release pair at steady fill, timed without the
// testing package so that the command links none of it. It measures in memory, on an embedded
// etcd, over client-go's fake clientset and, when a kube-apiserver binary is at hand, through a
// real kube-apiserver v1.33 on that etcd.
package bench
