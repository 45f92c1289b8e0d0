// Package gates tests the four combinations of the feature gates MultiCIDRServiceAllocator and
// DisableAllocatorDualWrite against real kube-apiservers v1.33: the mode each selects, every
// case of the Service matrix through the allocators of that mode on each cluster shape, with
// both stores checked after each step, and a dual-stack cluster whose IPv6 range is wider than
// the bitmap.
package gates

import (
	"os"
	"testing"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
