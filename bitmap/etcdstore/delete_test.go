package etcdstore_test

import (
	"context"
	"errors"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestDeleteRemovesTheKeyOnlyAtTheRevisionRead: Delete is a compare-and-delete on the key's
// ModRevision, in one transaction. At the revision read it removes the key; once anything has
// written or removed the key since, it reports a conflict carrying what is stored now and leaves
// the key as it is.
func TestDeleteRemovesTheKeyOnlyAtTheRevisionRead(t *testing.T) {
	client := testenv.NewEtcd(t).TestClient(t)
	s1 := bitmap.Snapshot{Range: testCIDR, Data: []byte{0x01}}
	s2 := bitmap.Snapshot{Range: testCIDR, Data: []byte{0x03}}
	tests := []struct {
		name string
		// setup prepares the key through s and client and returns the revision to delete at.
		setup        func(t *testing.T, s *etcdstore.Store, client *clientv3.Client) int64
		wantDeleted  bool // the key is gone afterwards
		wantConflict conflict
	}{
		{
			name: "at the revision read: removed",
			setup: func(t *testing.T, s *etcdstore.Store, _ *clientv3.Client) int64 {
				return update(t, s, 0, s1)
			},
			wantDeleted: true,
		},
		{
			name: "written since: a conflict carrying the new revision, nothing removed",
			setup: func(t *testing.T, s *etcdstore.Store, _ *clientv3.Client) int64 {
				rev := update(t, s, 0, s1)
				update(t, s, rev, s2)
				return rev
			},
			wantConflict: withWhatIsStored,
		},
		{
			name: "removed since: a conflict at revision 0",
			setup: func(t *testing.T, s *etcdstore.Store, client *clientv3.Client) int64 {
				rev := update(t, s, 0, s1)
				if _, err := client.Delete(t.Context(), s.Key()); err != nil {
					t.Fatal(err)
				}
				return rev
			},
			wantDeleted:  true, // by the other writer
			wantConflict: withNothingStored,
		},
		{
			name: "a foreign value written since: a plain conflict, nothing removed",
			setup: func(t *testing.T, s *etcdstore.Store, client *clientv3.Client) int64 {
				rev := update(t, s, 0, s1)
				if _, err := client.Put(t.Context(), s.Key(), "not a RangeAllocation"); err != nil {
					t.Fatal(err)
				}
				return rev
			},
			wantConflict: plain,
		},
		{
			name:        "revision 0 with nothing stored: nothing to do",
			setup:       func(*testing.T, *etcdstore.Store, *clientv3.Client) int64 { return 0 },
			wantDeleted: true,
		},
		{
			name: "revision 0 with a snapshot stored: a conflict, nothing removed",
			setup: func(t *testing.T, s *etcdstore.Store, _ *clientv3.Client) int64 {
				update(t, s, 0, s1)
				return 0
			},
			wantConflict: withWhatIsStored,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := etcdstore.New(client, "/registry/test/delete/"+t.Name())
			rev := tt.setup(t, s, client)
			_, before := rawValue(t, client, s.Key())

			err := s.Delete(t.Context(), rev)

			var ce *bitmap.ConflictError
			switch tt.wantConflict {
			case none:
				if err != nil {
					t.Fatalf("Delete(%d) = %v, want nil", rev, err)
				}
			case plain:
				if !errors.Is(err, bitmap.ErrConflict) || errors.As(err, &ce) {
					t.Errorf("Delete(%d) = %v, want plain ErrConflict: what is stored does not decode", rev, err)
				}
			case withWhatIsStored, withNothingStored:
				want := before
				if tt.wantConflict == withNothingStored {
					want = 0
				}
				if !errors.Is(err, bitmap.ErrConflict) || !errors.As(err, &ce) || ce.Rev != want {
					t.Errorf("Delete(%d) = %v, want a ConflictError carrying revision %d", rev, err, want)
				}
			}
			value, after := rawValue(t, client, s.Key())
			if gone := value == nil; gone != tt.wantDeleted {
				t.Errorf("after Delete(%d) the key is gone: %v, want %v", rev, gone, tt.wantDeleted)
			}
			if !tt.wantDeleted && after != before {
				t.Errorf("Delete(%d) that failed moved the key's ModRevision from %d to %d", rev, before, after)
			}
		})
	}
}

// conflict is what Delete should report.
type conflict int

const (
	none              conflict = iota // success
	plain                             // bitmap.ErrConflict without what is stored
	withWhatIsStored                  // a *bitmap.ConflictError carrying the key's revision
	withNothingStored                 // a *bitmap.ConflictError at revision 0
)

func TestDeleteOfAnInvalidStoreFailsWithoutPanicking(t *testing.T) {
	for name, s := range map[string]*etcdstore.Store{"zero": {}, "nil": nil, "nil client": etcdstore.New(nil, "/k")} {
		err := s.Delete(context.Background(), 1)
		if !errors.Is(err, etcdstore.ErrInvalidStore) || !errors.Is(err, allocator.ErrInvalid) {
			t.Errorf("Delete on %s Store = %v, want ErrInvalidStore", name, err)
		}
	}
}

// update writes snap at rev through s and returns the new revision.
func update(t *testing.T, s *etcdstore.Store, rev int64, snap bitmap.Snapshot) int64 {
	t.Helper()
	rev, err := s.Update(t.Context(), rev, snap)
	if err != nil {
		t.Fatalf("Update(%d) at %s: %v", rev, s.Key(), err)
	}
	return rev
}
