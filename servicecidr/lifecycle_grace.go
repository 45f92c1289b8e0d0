package servicecidr

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// clearMark records since when the ServiceCIDR with uid has orphaned nothing. The UID keeps a
// ServiceCIDR re-created under the same name from inheriting the grace period of the old one.
type clearMark struct {
	uid   types.UID
	since time.Time
}

func (c *LifecycleController) clearSinceOf(name string) time.Time {
	return c.clearMarkOf(name).since
}

func (c *LifecycleController) clearMarkOf(name string) clearMark {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.clearSince[name]
}

// setClearSince records since when the ServiceCIDR name with uid orphans nothing; the zero time
// forgets it.
func (c *LifecycleController) setClearSince(name string, uid types.UID, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.IsZero() {
		delete(c.clearSince, name)
	} else {
		c.clearSince[name] = clearMark{uid: uid, since: t}
	}
}
