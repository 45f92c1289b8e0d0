//go:build !unix

package repair

// cpuTime returns 0 where getrusage is not available; the cpu-ns/op metric is then meaningless.
func cpuTime() int64 { return 0 }
