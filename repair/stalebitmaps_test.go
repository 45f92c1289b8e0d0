package repair

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/client-go/kubernetes/fake"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/bitmaptest"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// memStores keeps the bitmaps in MemStores, which cannot delete (they are no bitmap.Deleter).
type memStores []*bitmaptest.MemStore

func (m memStores) Store(i int) bitmap.Store { return m[i] }

// TestRemoveStaleBitmapsDeletesEachAtTheRevisionTheAuditRead: the bitmaps an IPAddressOnly audit
// reports as stale are removed from etcd with a compare-and-delete at the revision it read. One
// written since is left, and reported by an error matching bitmap.ErrConflict, while the others
// go; nothing is removed outside IPAddressOnly mode, from a store that cannot delete, or for a
// bitmap that an audit of another Config reported.
func TestRemoveStaleBitmapsDeletesEachAtTheRevisionTheAuditRead(t *testing.T) {
	cli := testenv.NewEtcd(t).TestClient(t)
	ranges := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("fd00::/64")}
	v4, v6 := bits(t, "10.0.0.0/24", "10.0.0.10"), bits(t, "fd00::/64", "fd00::10")
	tests := []struct {
		name string
		// change changes the Config of the removal, or the stale bitmaps, from those of the audit,
		// and returns the stale bitmaps to remove.
		change func(cfg *clusterip.Config, stale []StaleBitmap) []StaleBitmap
		// between runs between the audit and the removal.
		between     func(t *testing.T, prefix string)
		wantRemoved []string // keys, below the prefix
		wantLeft    []string
		wantErr     []error // each matched with errors.Is
		wantConfig  string  // the Field of a *clusterip.ConfigError
	}{
		{
			name:        "every stale bitmap, at the revision the audit read",
			wantRemoved: []string{etcdstore.ServiceIPsPath, etcdstore.SecondaryServiceIPsPath},
		},
		{
			name: "a bitmap written since the audit is left, the others removed",
			between: func(t *testing.T, prefix string) {
				storeBitmap(t, cli, etcdstore.SecondaryServiceIPsKey(prefix), bits(t, "fd00::/64", "fd00::10", "fd00::11"))
			},
			wantRemoved: []string{etcdstore.ServiceIPsPath},
			wantLeft:    []string{etcdstore.SecondaryServiceIPsPath},
			wantErr:     []error{bitmap.ErrConflict},
		},
		{
			name: "not in IPAddressOnly mode: nothing",
			change: func(cfg *clusterip.Config, stale []StaleBitmap) []StaleBitmap {
				cfg.Mode = featuregate.DualWrite
				return stale
			},
			wantLeft:   []string{etcdstore.ServiceIPsPath, etcdstore.SecondaryServiceIPsPath},
			wantConfig: "Mode",
		},
		{
			name: "without Bitmaps: nothing",
			change: func(cfg *clusterip.Config, stale []StaleBitmap) []StaleBitmap {
				cfg.Bitmaps = nil
				return stale
			},
			wantLeft:   []string{etcdstore.ServiceIPsPath, etcdstore.SecondaryServiceIPsPath},
			wantConfig: "Bitmaps",
		},
		{
			name: "stores that cannot delete: nothing, unsupported",
			change: func(cfg *clusterip.Config, stale []StaleBitmap) []StaleBitmap {
				cfg.Bitmaps = memStores{bitmaptest.NewMemStore(), bitmaptest.NewMemStore()}
				for i := range stale {
					stale[i].Key = storeName(cfg.Bitmaps.Store(i))
				}
				return stale
			},
			wantLeft: []string{etcdstore.ServiceIPsPath, etcdstore.SecondaryServiceIPsPath},
			wantErr:  []error{errors.ErrUnsupported, errors.ErrUnsupported},
		},
		{
			name: "bitmaps an audit of another Config reported: nothing",
			change: func(_ *clusterip.Config, stale []StaleBitmap) []StaleBitmap {
				otherKey, otherRange, unread := stale[0], stale[1], stale[0]
				otherKey.Key = etcdstore.ServiceIPsKey("/elsewhere")
				otherRange.Range = "fd00:1::/64"
				unread.Revision = 0
				return []StaleBitmap{otherKey, otherRange, unread}
			},
			wantLeft: []string{etcdstore.ServiceIPsPath, etcdstore.SecondaryServiceIPsPath},
			wantErr:  []error{&StaleBitmapError{}, &StaleBitmapError{}, &StaleBitmapError{}},
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := fmt.Sprintf("/remove%d", i)
			storeBitmap(t, cli, etcdstore.ServiceIPsKey(prefix), v4)
			storeBitmap(t, cli, etcdstore.SecondaryServiceIPsKey(prefix), v6)
			cfg := clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: ranges, Client: fake.NewClientset(), Bitmaps: etcdstore.Stores{Client: cli, Prefix: prefix}}
			rep, err := Audit(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.StaleBitmaps) != 2 {
				t.Fatalf("the audit reported stale bitmaps %+v, want the 2 stored", rep.StaleBitmaps)
			}
			stale := rep.StaleBitmaps
			if tt.change != nil {
				stale = tt.change(&cfg, stale)
			}
			if tt.between != nil {
				tt.between(t, prefix)
			}

			removed, err := RemoveStaleBitmaps(t.Context(), cfg, stale)

			var ce *clusterip.ConfigError
			switch {
			case tt.wantConfig != "":
				if !errors.As(err, &ce) || ce.Field != tt.wantConfig {
					t.Errorf("RemoveStaleBitmaps() = %v, want a ConfigError on %s", err, tt.wantConfig)
				}
			case len(tt.wantErr) == 0 && err != nil:
				t.Errorf("RemoveStaleBitmaps() = %v, want nil", err)
			case len(tt.wantErr) > 0:
				checkStaleBitmapErrors(t, err, tt.wantErr)
			}
			var gotKeys []string
			for _, b := range removed {
				gotKeys = append(gotKeys, b.Key)
			}
			var wantKeys []string
			for _, p := range tt.wantRemoved {
				wantKeys = append(wantKeys, prefix+"/"+p)
			}
			if diff := cmp.Diff(wantKeys, gotKeys, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("RemoveStaleBitmaps() removed (-want +got):\n%s", diff)
			}
			for _, p := range tt.wantRemoved {
				if rev := modRevision(t, cli, prefix+"/"+p); rev != 0 {
					t.Errorf("%s/%s is still in etcd (mod revision %d), want it removed", prefix, p, rev)
				}
			}
			for _, p := range tt.wantLeft {
				if rev := modRevision(t, cli, prefix+"/"+p); rev == 0 {
					t.Errorf("%s/%s was removed from etcd, want it left", prefix, p)
				}
			}
		})
	}
}

// checkStaleBitmapErrors fails t unless err joins one *StaleBitmapError per element of want, in
// order, each matching it with errors.Is (or, for a *StaleBitmapError in want, with errors.As).
func checkStaleBitmapErrors(t *testing.T, err error, want []error) {
	t.Helper()
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("RemoveStaleBitmaps() = %v, want %d joined *StaleBitmapErrors", err, len(want))
	}
	errs := joined.Unwrap()
	if len(errs) != len(want) {
		t.Fatalf("RemoveStaleBitmaps() = %v, want %d joined errors", err, len(want))
	}
	for i, e := range errs {
		var sbe *StaleBitmapError
		if !errors.As(e, &sbe) {
			t.Errorf("error %d = %v, want a *StaleBitmapError", i, e)
			continue
		}
		if _, kindOnly := want[i].(*StaleBitmapError); !kindOnly && !errors.Is(e, want[i]) {
			t.Errorf("error %d = %v, want one matching %v", i, e, want[i])
		}
	}
}

// modRevision returns the ModRevision of key in the etcd cli reaches, 0 if it does not exist.
func modRevision(t *testing.T, cli *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := cli.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return 0
	}
	return resp.Kvs[0].ModRevision
}
