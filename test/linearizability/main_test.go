package linearizability

import (
	"os"
	"testing"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
