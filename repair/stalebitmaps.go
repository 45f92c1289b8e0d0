package repair

import (
	"context"
	"errors"
	"fmt"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/featuregate"
)

// StaleBitmapError reports a stale bitmap that RemoveStaleBitmaps left in place, and why. It
// matches bitmap.ErrConflict with errors.Is when the bitmap was written or removed after the
// audit read it (something still writes it: it is not stale), and errors.ErrUnsupported when its
// Store cannot delete (is not a bitmap.Deleter).
type StaleBitmapError struct {
	// Bitmap is the stale bitmap, as the audit reported it.
	Bitmap StaleBitmap
	// Err is why it was left.
	Err error
}

// Error implements error.
func (e *StaleBitmapError) Error() string {
	return fmt.Sprintf("repair: stale bitmap of %s at %s (revision %d) left in place: %v", e.Bitmap.Range, e.Bitmap.Key, e.Bitmap.Revision, e.Err)
}

// Unwrap returns Err.
func (e *StaleBitmapError) Unwrap() error { return e.Err }

// RemoveStaleBitmaps deletes each bitmap of stale, as an IPAddressOnly audit of cfg reported it
// (Report.StaleBitmaps), from the store cfg.Bitmaps gives for its range, with a compare-and-delete
// at the revision the audit read (bitmap.Deleter), and returns those it removed, in the order
// given. It removes nothing else, and needs no API server (cfg.Client is not used).
//
// Call it only once CheckBitmapWriters has found that no live kube-apiserver can write the
// bitmaps: a server in Legacy or DualWrite mode would recreate a removed bitmap, or keep writing
// one it no longer finds where it left it. The compare-and-delete guards against a write since
// the audit, not against a server that writes the bitmap later.
//
// Each bitmap it leaves is reported by a *StaleBitmapError, joined with the others' (errors.Join):
// one written or removed since the audit read it matches bitmap.ErrConflict; one whose store is
// not a bitmap.Deleter matches errors.ErrUnsupported; one whose range is not in cfg.Ranges, whose
// store is not at its Key, or whose Revision is not positive was not reported by an audit of cfg
// and is refused as such. A bitmap's failure does not stop the others'. cfg must be valid, in
// IPAddressOnly mode (in the other modes the bitmaps are in use), with Bitmaps; otherwise it
// returns a *clusterip.ConfigError and removes nothing.
func RemoveStaleBitmaps(ctx context.Context, cfg clusterip.Config, stale []StaleBitmap) (removed []StaleBitmap, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch {
	case cfg.Mode != featuregate.IPAddressOnly:
		return nil, &clusterip.ConfigError{Field: "Mode", Reason: "stale bitmaps are removed only in IPAddressOnly mode: in " + cfg.Mode.String() + " mode the bitmaps are in use"}
	case cfg.Bitmaps == nil:
		return nil, &clusterip.ConfigError{Field: "Bitmaps", Reason: "required to remove the stale bitmaps from their store (etcdstore.Stores for kube-apiserver's, in its etcd)"}
	}
	var errs []error
	for _, sb := range stale {
		if err := removeStaleBitmap(ctx, &cfg, sb); err != nil {
			errs = append(errs, &StaleBitmapError{Bitmap: sb, Err: err})
			continue
		}
		removed = append(removed, sb)
	}
	return removed, errors.Join(errs...)
}

// removeStaleBitmap deletes sb from its store in cfg at its revision.
func removeStaleBitmap(ctx context.Context, cfg *clusterip.Config, sb StaleBitmap) error {
	if sb.Revision <= 0 {
		return fmt.Errorf("revision %d: not one an audit read", sb.Revision)
	}
	for i, r := range cfg.Ranges {
		if r.String() != sb.Range {
			continue
		}
		store := cfg.Bitmaps.Store(i)
		name := storeName(store)
		if name != sb.Key {
			return fmt.Errorf("the store of range %s is %s, not %s: the audit read another Config", r, name, sb.Key)
		}
		d, ok := store.(bitmap.Deleter)
		if !ok {
			return fmt.Errorf("%s cannot delete (it is not a bitmap.Deleter): %w", name, errors.ErrUnsupported)
		}
		return d.Delete(ctx, sb.Revision)
	}
	return fmt.Errorf("range %s is not in Config.Ranges %v: the audit read another Config", sb.Range, cfg.Ranges)
}
