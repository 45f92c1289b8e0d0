package webhook_test

import (
	"os"
	"testing"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestMain builds kube-apiserver, if needed, before the tests start, so that a first build on a
// new machine counts neither against -timeout nor against any test (see testenv.Main).
func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
