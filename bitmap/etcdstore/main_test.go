package etcdstore_test

import (
	"os"
	"testing"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestMain builds kube-apiserver, if this clone has none yet, before the interop test's
// -timeout starts; see testenv.Main.
func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
