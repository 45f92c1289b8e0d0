// Package ready tests clusterip.Allocators.WaitReady beside a real kube-apiserver: what it answers as
// ServiceCIDRs come and change their Ready condition, and the default ServiceCIDR that Run
// creates for a registry with no kube-apiserver of its own.
package ready

import (
	"os"
	"testing"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
