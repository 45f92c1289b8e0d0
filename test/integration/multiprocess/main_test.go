// Package multiprocess tests clusterip's allocators in separate OS processes against a real etcd
// and kube-apiserver v1.33: a Legacy and a DualWrite process side by side as during an upgrade
// (skew), a process SIGKILLed between the two writes of a dual write and etcd restarted under
// running allocators (faults), and three processes saturating one bitmap key (fairness). An
// allocator process is this test binary run again (allocproc_test.go).
package multiprocess

import (
	"os"
	"testing"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

// testManagedBy is the Config.ManagedBy of tests whose addresses are held for no Service, so that a
// real kube-apiserver's repair loop leaves their IPAddress objects alone.
const testManagedBy = "clusterip-test"

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
