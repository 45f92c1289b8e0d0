// Package flagchange tests a change of --service-cluster-ip-range under clusterip's allocators,
// against a real etcd and kube-apiservers v1.33: a bitmap kube-apiserver stored for another range
// (Legacy refuses as kube-apiserver does until repair rewrites it; DualWrite answers as
// kube-apiserver does beside it), and the flag changes of upstream's
// test/integration/servicecidr TestServiceCIDRMigrationScenarios in Legacy and DualWrite mode.
package flagchange

import (
	"os"
	"testing"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
