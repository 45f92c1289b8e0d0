// Package repair_test holds the system tests of package repair
// (github.com/kube-ipam/clusterip/repair) that start a real kube-apiserver v1.33 and etcd, apart
// from the package they test, as Kubernetes keeps test/integration/servicecidr apart from its
// registry: the soak test of issue 11 (soak_test.go), which runs allocator processes in every mode
// under an etcd restart and a SIGKILL and then audits and repairs the cluster, and the audits and
// repair passes of a real cluster seeded with drift. They use repair's public API only; the
// tests that need repair's internals, and its fast tests on fake clients, stay in the package.
//
// They skip in -short mode. The kube-apiserver binary is found or built as
// internal/localcluster says (CLUSTERIP_KUBE_APISERVER names a prebuilt one).
package repair_test

import (
	"os"
	"testing"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestMain builds kube-apiserver, if needed, before the tests start, so that a first build on a
// new machine counts neither against -timeout nor against any test (see testenv.Main).
func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
