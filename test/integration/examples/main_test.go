package examples

import (
	"os"
	"testing"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestMain builds etcd and kube-apiserver, if needed, before the tests start (see testenv.Main).
func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
