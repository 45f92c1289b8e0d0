package etcdstore_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/bitmaptest"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
)

// TestConstructorsRejectNilAndZeroArguments calls every exported constructor of bitmap and
// etcdstore with nil or zero arguments and checks that each returns an error matching
// allocator.ErrInvalid, at construction or (for etcdstore.New, which returns no error) from the
// first method call and from NewPersistent over it, instead of panicking.
func TestConstructorsRejectNilAndZeroArguments(t *testing.T) {
	ctx := context.Background()
	cidr := netip.MustParsePrefix("10.96.0.0/24")
	newPersistent := func(store bitmap.Store, opts ...bitmap.PersistentOption) error {
		_, err := bitmap.NewPersistent(ctx, cidr, store, opts...)
		return err
	}
	storeGet := func(s *etcdstore.Store) error {
		_, _, err := s.Get(ctx)
		return err
	}
	storeUpdate := func(s *etcdstore.Store) error {
		_, err := s.Update(ctx, 0, bitmap.Snapshot{Range: cidr.String()})
		return err
	}
	tests := []struct {
		name string
		call func() error
	}{
		{name: "bitmap.New zero Prefix", call: func() error { _, err := bitmap.New(netip.Prefix{}); return err }},
		{name: "bitmap.New nil Option", call: func() error { _, err := bitmap.New(cidr, nil); return err }},
		{name: "bitmap.NewPersistent nil Store", call: func() error { return newPersistent(nil) }},
		{name: "bitmap.NewPersistent zero Prefix", call: func() error {
			_, err := bitmap.NewPersistent(ctx, netip.Prefix{}, bitmaptest.NewMemStore())
			return err
		}},
		{name: "bitmap.NewPersistent nil Option", call: func() error { return newPersistent(bitmaptest.NewMemStore(), nil) }},
		{name: "bitmap.NewPersistent nil *MemStore", call: func() error { return newPersistent((*bitmaptest.MemStore)(nil)) }},
		{name: "bitmap.NewPersistent nil *etcdstore.Store", call: func() error { return newPersistent((*etcdstore.Store)(nil)) }},
		{name: "bitmap.NewPersistent zero etcdstore.Store", call: func() error { return newPersistent(&etcdstore.Store{}) }},
		{name: "bitmap.NewPersistent etcdstore.New nil client", call: func() error {
			return newPersistent(etcdstore.New(nil, etcdstore.DefaultServiceIPsKey))
		}},
		{name: "etcdstore.New nil client: Get", call: func() error { return storeGet(etcdstore.New(nil, etcdstore.DefaultServiceIPsKey)) }},
		{name: "etcdstore.New nil client: Update", call: func() error { return storeUpdate(etcdstore.New(nil, etcdstore.DefaultServiceIPsKey)) }},
		{name: "etcdstore zero Store: Get", call: func() error { return storeGet(&etcdstore.Store{}) }},
		{name: "etcdstore nil *Store: Update", call: func() error { return storeUpdate(nil) }},
		{name: "etcdstore zero Stores: NewPersistent over Store(0)", call: func() error { return newPersistent(etcdstore.Stores{}.Store(0)) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("panicked: %v", r)
					}
				}()
				err = tt.call()
			}()
			if !errors.Is(err, allocator.ErrInvalid) {
				t.Errorf("error = %v, want one matching allocator.ErrInvalid", err)
			}
		})
	}
}
