package ipaddress

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-ipam/clusterip/internal/ipmath"
)

// step is one thing that happens to the address under test.
type step struct {
	do      string    // "begin-create", "begin-delete", "settle", "event", "cache-add", "cache-del", "wait", "wait-settle"
	present bool      // event: added/updated (true) or deleted
	behind  bool      // event: the informer cache is already past it (else the event updates it first, as an informer does)
	update  bool      // event: an Update rather than an Add
	uid     types.UID // event, settle, cache-add
	rv      uint64    // event, settle, cache-add
	result  writeKind // settle
	want    bool      // Has afterwards
}

// TestAssumeCache drives the index of one address through writes and informer events in the orders
// a lagging informer produces, and checks Has after each step.
func TestAssumeCache(t *testing.T) {
	const timeout = time.Minute
	tests := []struct {
		name        string
		steps       []step
		wantPending bool // an entry is left for the address at the end
	}{
		{
			name: "stale Delete after we created the address again is ignored",
			steps: []step{
				{do: "cache-add", uid: "u1", rv: 5},
				{do: "event", present: true, uid: "u1", rv: 5, want: true},
				{do: "begin-delete", want: true},
				{do: "settle", result: writeDeleted, want: false},
				{do: "begin-create", want: true},
				{do: "settle", result: writeCreated, uid: "u2", rv: 9, want: true},
				{do: "event", present: false, uid: "u1", rv: 5, want: true}, // the stale Delete
				{do: "event", present: true, uid: "u2", rv: 9, want: true},  // informer caught up
				{do: "event", present: false, uid: "u2", rv: 12, want: false},
			},
		},
		{
			name: "stale Add of the object we deleted is ignored",
			steps: []step{
				{do: "cache-add", uid: "u1", rv: 5},
				{do: "begin-delete", want: false},
				{do: "settle", result: writeDeleted, want: false},
				{do: "event", present: true, uid: "u1", rv: 5, want: false},
				{do: "event", present: false, uid: "u1", rv: 5, want: false},
			},
		},
		{
			name: "a newer object after our delete counts",
			steps: []step{
				{do: "cache-add", uid: "u1", rv: 5},
				{do: "event", present: true, uid: "u1", rv: 5, want: true},
				{do: "begin-delete", want: true},
				{do: "settle", result: writeDeleted, want: false},
				{do: "event", present: true, uid: "u3", rv: 8, want: true},
			},
		},
		{
			name: "an older object's events do not undo our create",
			steps: []step{
				{do: "begin-create", want: true},
				{do: "settle", result: writeCreated, uid: "u2", rv: 9, want: true},
				{do: "event", present: true, uid: "u0", rv: 3, want: true},
				{do: "event", present: false, uid: "u0", rv: 3, want: true},
			},
			wantPending: true,
		},
		{
			name: "event during the create settles it",
			steps: []step{
				{do: "begin-create", want: true},
				{do: "event", present: true, uid: "u2", rv: 9, want: true},
				{do: "settle", result: writeCreated, uid: "u2", rv: 9, want: true},
			},
		},
		{
			name: "deletion by someone else during our create wins",
			steps: []step{
				{do: "begin-create", want: true},
				{do: "event", present: true, uid: "u2", rv: 9, want: true},
				{do: "event", present: false, uid: "u2", rv: 10, want: true},
				{do: "settle", result: writeCreated, uid: "u2", rv: 9, want: false},
			},
		},
		{
			name: "failed create falls back to the informer",
			steps: []step{
				{do: "begin-create", want: true},
				{do: "settle", result: writeFailed, want: false},
			},
		},
		{
			name: "failed create of an address the informer holds",
			steps: []step{
				{do: "cache-add", uid: "u1", rv: 5},
				{do: "begin-create", want: true},
				{do: "settle", result: writeFailed, want: true},
			},
		},
		{
			name: "failed delete keeps our assumed create",
			steps: []step{
				{do: "begin-create", want: true},
				{do: "settle", result: writeCreated, uid: "u2", rv: 9, want: true},
				{do: "begin-delete", want: true},
				{do: "settle", result: writeFailed, want: true},
				{do: "event", present: false, uid: "u1", rv: 4, want: true},
				{do: "event", present: true, uid: "u2", rv: 9, want: true},
			},
		},
		{
			name: "assumed create expires to the informer cache",
			steps: []step{
				{do: "begin-create", want: true},
				{do: "settle", result: writeCreated, uid: "u2", rv: 9, want: true},
				{do: "wait", want: false},
			},
		},
		{
			name: "assumed delete expires to the informer cache",
			steps: []step{
				{do: "cache-add", uid: "u1", rv: 5},
				{do: "begin-delete", want: false},
				{do: "settle", result: writeDeleted, want: false},
				{do: "wait", want: true},
			},
		},
		{
			name: "AlreadyExists counts as allocated until the informer says otherwise",
			steps: []step{
				{do: "begin-create", want: true},
				{do: "settle", result: writeExists, want: true},
				{do: "event", present: false, uid: "u7", rv: 20, want: false},
			},
		},
		{
			name: "NotFound on delete counts as free",
			steps: []step{
				{do: "cache-add", uid: "u1", rv: 5},
				{do: "event", present: true, uid: "u1", rv: 5, want: true},
				{do: "begin-delete", want: true},
				{do: "settle", result: writeNotFound, want: false},
				{do: "event", present: true, uid: "u1", rv: 5, want: false},
				{do: "event", present: false, uid: "u1", rv: 6, want: false},
			},
		},
		{
			name: "NotFound for an address nobody knew about assumes nothing: a later object counts at once",
			steps: []step{
				{do: "begin-delete", want: false},
				{do: "settle", result: writeNotFound, want: false},
				{do: "event", present: true, uid: "u5", rv: 30, want: true},
			},
		},
		{
			name: "NotFound for an address nobody knew about: an object added during the Delete counts",
			steps: []step{
				{do: "begin-delete", want: false},
				{do: "event", present: true, uid: "u5", rv: 30, want: false},
				{do: "settle", result: writeNotFound, want: true},
			},
		},
		{
			name: "deleting an object the informer had not shown: an Add we cannot order counts within a second",
			steps: []step{
				{do: "begin-delete", want: false},
				{do: "settle", result: writeDeleted, want: false},
				{do: "cache-add", uid: "u9", rv: 40},
				{do: "event", present: true, uid: "u9", rv: 40, want: false},
				{do: "wait-settle", want: true},
			},
		},
		{
			name: "deleting an object the informer had not shown: its stale Add and Delete change nothing",
			steps: []step{
				{do: "begin-delete", want: false},
				{do: "settle", result: writeDeleted, want: false},
				{do: "event", present: true, uid: "u1", rv: 5, want: false},
				{do: "event", present: false, uid: "u1", rv: 5, want: false},
				{do: "wait-settle", want: false},
			},
		},
		{
			name: "a new object whose resourceVersion is not a number counts within a second",
			steps: []step{
				{do: "cache-add", uid: "u1", rv: 5},
				{do: "event", present: true, uid: "u1", rv: 5, want: true},
				{do: "begin-delete", want: true},
				{do: "settle", result: writeDeleted, want: false},
				{do: "cache-add", uid: "u3", rv: 0},
				{do: "event", present: true, uid: "u3", rv: 0, want: false},
				{do: "wait-settle", want: true},
			},
		},
		{
			name: "a stale Update of the object we deleted is no reason to look again",
			steps: []step{
				{do: "cache-add", uid: "u1", rv: 5},
				{do: "begin-delete", want: false},
				{do: "settle", result: writeDeleted, want: false},
				{do: "event", present: true, uid: "u1", rv: 6, want: false},
				{do: "wait-settle", want: false},
			},
			wantPending: true,
		},
		{
			name: "a second Release faster than the informer: the stale Add of the object we deleted is ignored",
			steps: []step{
				{do: "begin-create", want: true},
				{do: "settle", result: writeCreated, uid: "u1", rv: 5, want: true},
				{do: "begin-delete", want: true},
				{do: "settle", result: writeDeleted, want: false},
				{do: "begin-delete", want: false},
				{do: "settle", result: writeNotFound, want: false},
				{do: "event", present: true, uid: "u1", rv: 5, want: false},
				{do: "event", present: false, uid: "u1", rv: 6, want: false},
			},
		},
		{
			name: "a second Release with the cache ahead of the handler: the stale Add is ignored",
			steps: []step{
				{do: "begin-create", want: true},
				{do: "settle", result: writeCreated, uid: "u1", rv: 5, want: true},
				{do: "cache-add", uid: "u1", rv: 5},
				{do: "begin-delete", want: true},
				{do: "settle", result: writeDeleted, want: false},
				{do: "cache-del", uid: "u1", rv: 6},
				{do: "begin-delete", want: false},
				{do: "settle", result: writeNotFound, want: false},
				{do: "event", present: true, uid: "u1", rv: 5, behind: true, want: false},
				{do: "event", present: false, uid: "u1", rv: 6, behind: true, want: false},
			},
		},
		{
			name: "a second Release: the stale Add arriving while its Delete is in flight is ignored",
			steps: []step{
				{do: "begin-create", want: true},
				{do: "settle", result: writeCreated, uid: "u1", rv: 5, want: true},
				{do: "begin-delete", want: true},
				{do: "settle", result: writeDeleted, want: false},
				{do: "begin-delete", want: false},
				{do: "event", present: true, uid: "u1", rv: 5, want: false},
				{do: "settle", result: writeNotFound, want: false},
				{do: "event", present: false, uid: "u1", rv: 6, want: false},
			},
		},
		{
			name: "a second Release still sees a newer object that the informer shows",
			steps: []step{
				{do: "begin-create", want: true},
				{do: "settle", result: writeCreated, uid: "u1", rv: 5, want: true},
				{do: "begin-delete", want: true},
				{do: "settle", result: writeDeleted, want: false},
				{do: "begin-delete", want: false},
				{do: "settle", result: writeNotFound, want: false},
				{do: "event", present: true, uid: "u1", rv: 5, want: false},
				{do: "event", present: false, uid: "u1", rv: 6, want: false},
				{do: "event", present: true, uid: "u7", rv: 9, want: true},
			},
		},
		{
			name: "Allocate of an address we created gets AlreadyExists: a stale Delete does not free it",
			steps: []step{
				{do: "cache-add", uid: "u1", rv: 5},
				{do: "event", present: true, uid: "u1", rv: 5, want: true},
				{do: "begin-delete", want: true},
				{do: "settle", result: writeDeleted, want: false},
				{do: "begin-create", want: true},
				{do: "settle", result: writeCreated, uid: "u2", rv: 9, want: true},
				{do: "begin-create", want: true},
				{do: "event", present: false, uid: "u1", rv: 6, want: true},
				{do: "settle", result: writeExists, want: true},
				{do: "event", present: true, uid: "u2", rv: 9, want: true},
			},
		},
		{
			name: "an event of an object the cache no longer holds does not outweigh the cache",
			steps: []step{
				{do: "cache-add", uid: "u1", rv: 5},
				{do: "cache-del", uid: "u1", rv: 6},
				{do: "event", present: true, uid: "u1", rv: 5, behind: true, want: false},
				{do: "event", present: false, uid: "u1", rv: 6, behind: true, want: false},
			},
		},
		{
			name: "without UIDs and resource versions the one event owed settles a create",
			steps: []step{
				{do: "begin-create", want: true},
				{do: "settle", result: writeCreated, want: true},
				{do: "event", present: false, want: false},
			},
		},
		{
			name: "without UIDs and resource versions a stale Delete of an earlier round does not free our create",
			steps: []step{
				{do: "begin-create", want: true},
				{do: "settle", result: writeCreated, want: true},
				{do: "begin-delete", want: true},
				{do: "settle", result: writeDeleted, want: false},
				{do: "begin-create", want: true},
				{do: "settle", result: writeCreated, want: true},
				{do: "event", present: true, want: true},
				{do: "event", present: false, want: true}, // the cache is absent: it must not count
				{do: "event", present: true, want: true},
			},
		},
		{
			name: "without UIDs and resource versions a stale Add of an earlier round does not undo our delete",
			steps: []step{
				{do: "begin-create", want: true},
				{do: "settle", result: writeCreated, want: true},
				{do: "begin-delete", want: true},
				{do: "settle", result: writeDeleted, want: false},
				{do: "begin-create", want: true},
				{do: "settle", result: writeCreated, want: true},
				{do: "begin-delete", want: true},
				{do: "settle", result: writeDeleted, want: false},
				{do: "event", present: true, want: false},
				{do: "event", present: false, want: false},
				{do: "event", present: true, want: false}, // the cache is present: it must not count
				{do: "wait-settle", want: false},
				{do: "event", present: false, want: false},
				{do: "event", present: true, want: true}, // someone else's object, after ours
			},
		},
		{
			name: "without UIDs and resource versions an Update is no transition",
			steps: []step{
				{do: "begin-create", want: true},
				{do: "settle", result: writeCreated, want: true},
				{do: "begin-delete", want: true},
				{do: "settle", result: writeDeleted, want: false},
				{do: "event", present: true, want: false},
				{do: "event", present: true, update: true, want: false},
				{do: "event", present: false, want: false},
			},
		},
	}
	cidr := netip.MustParsePrefix("10.9.0.0/24")
	ip := netip.MustParseAddr("10.9.0.77")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, cidr, fixtureOptions{noStart: true}, WithAssumeTimeout(timeout))
			a := f.a
			now := time.Unix(1000, 0)
			a.now = func() time.Time { return now }
			off, _ := ipmath.Offset(cidr, ip)
			store := a.informer.GetIndexer()
			for i, s := range tt.steps {
				a.mu.Lock()
				switch s.do {
				case "begin-create", "begin-delete":
					if ch := a.beginLocked(off, s.do == "begin-create"); ch != nil {
						t.Fatalf("step %d: %s found a write in flight", i, s.do)
					}
				case "settle":
					a.settleLocked(off, writeResult{kind: s.result, uid: s.uid, rv: s.rv})
				case "event":
					if !s.behind {
						if s.present {
							store.Add(ipAddressObject(ip.String(), s.uid, s.rv))
						} else {
							store.Delete(ipAddressObject(ip.String(), s.uid, s.rv))
						}
					}
					a.applyLocked(off, event{present: s.present, uid: s.uid, rv: s.rv, update: s.update})
				case "cache-add":
					store.Add(ipAddressObject(ip.String(), s.uid, s.rv))
				case "cache-del":
					store.Delete(ipAddressObject(ip.String(), s.uid, s.rv))
				case "wait":
					now = now.Add(timeout + time.Second)
				case "wait-settle":
					now = now.Add(time.Second)
				}
				a.mu.Unlock()
				if s.do == "cache-add" || s.do == "cache-del" {
					continue
				}
				if got := a.Has(ip); got != s.want {
					t.Fatalf("step %d (%s %+v): Has() = %v, want %v", i, s.do, s, got, s.want)
				}
				if want := map[bool]uint64{false: 0, true: 1}[s.want]; a.Used() != want {
					t.Fatalf("step %d: Used() = %d, want %d", i, a.Used(), want)
				}
			}
			if _, ok := a.pending[off]; ok != tt.wantPending {
				t.Errorf("pending entry left = %v, want %v", ok, tt.wantPending)
			}
		})
	}
}

// TestConcurrentWritesOnOneAddressWait checks that a second write on an address waits for the
// first to settle.
func TestConcurrentWritesOnOneAddressWait(t *testing.T) {
	f := newFixture(t, netip.MustParsePrefix("10.9.0.0/24"), fixtureOptions{noStart: true})
	a := f.a
	a.mu.Lock()
	if ch := a.beginLocked(5, true); ch != nil {
		t.Fatal("first begin waited")
	}
	ch := a.beginLocked(5, false)
	if ch == nil {
		t.Fatal("second begin did not wait")
	}
	a.settleLocked(5, writeResult{kind: writeCreated, uid: "u", rv: 1})
	a.mu.Unlock()
	select {
	case <-ch:
	default:
		t.Fatal("settling did not release the waiter")
	}
}

// TestAssumeCacheFollowsItsOwnWrites checks a property against a model of the API server and of
// an informer running behind it: when the Allocator is the only writer of an address, Has reports
// what the server holds after each of its writes and after each informer event, however far the
// informer lags. The writes are random Creates and Deletes, some of them redundant (a Create that
// gets AlreadyExists, a Delete that gets NotFound); the informer's cache takes the server's events
// in order at random moments, and the handler follows the cache at random moments, never ahead of
// it, as a shared informer does. Deletion events carry the object's last resourceVersion (as the
// module's fakeclient's do) or a new one (as kube-apiserver's do); or objects have neither a UID
// nor a resourceVersion (as client-go's fake clientset's).
func TestAssumeCacheFollowsItsOwnWrites(t *testing.T) {
	cidr := netip.MustParsePrefix("10.9.0.0/24")
	ip := netip.MustParseAddr("10.9.0.77")
	off, _ := ipmath.Offset(cidr, ip)
	for _, mode := range []string{"old delete rv", "new delete rv", "anonymous"} {
		newDeleteRV, anonymous := mode == "new delete rv", mode == "anonymous"
		for seed := range uint64(500) {
			r := rand.New(rand.NewPCG(seed, 1))
			f := newFixture(t, cidr, fixtureOptions{noStart: true})
			a := f.a
			store := a.informer.GetIndexer()
			var (
				events            []event // the server's watch events
				cached, delivered int     // events taken by the cache, and by the handler
				rv                uint64
				server            event // what the server holds
				trace             []string
			)
			lag := func() {
				for cached < len(events) && r.IntN(2) == 0 {
					e := events[cached]
					if e.present {
						store.Add(ipAddressObject(ip.String(), e.uid, e.rv))
					} else {
						store.Delete(ipAddressObject(ip.String(), e.uid, e.rv))
					}
					cached++
					trace = append(trace, fmt.Sprintf("cache takes %+v", e))
				}
				for delivered < cached && r.IntN(2) == 0 {
					e := events[delivered]
					a.mu.Lock()
					a.applyLocked(off, e)
					a.mu.Unlock()
					delivered++
					trace = append(trace, fmt.Sprintf("handler takes %+v: Has %v", e, a.Has(ip)))
				}
			}
			for step := range 12 {
				create := !server.present
				if r.IntN(3) == 0 {
					create = !create // redundant
				}
				a.mu.Lock()
				if ch := a.beginLocked(off, create); ch != nil {
					t.Fatal("a write is in flight")
				}
				a.mu.Unlock()
				lag()
				var res writeResult
				switch {
				case create && server.present:
					res.kind = writeExists
				case create:
					rv++
					server = event{present: true, uid: types.UID(fmt.Sprint("u", rv)), rv: rv}
					if anonymous {
						server = event{present: true}
					}
					events = append(events, server)
					res = writeResult{kind: writeCreated, uid: server.uid, rv: server.rv}
				case !server.present:
					res.kind = writeNotFound
				default:
					server.present = false
					if newDeleteRV && !anonymous {
						rv++
						server.rv = rv
					}
					events = append(events, server)
					res.kind = writeDeleted
				}
				lag()
				a.mu.Lock()
				a.settleLocked(off, res)
				a.mu.Unlock()
				trace = append(trace, fmt.Sprintf("write %d settles (create %v) %+v: Has %v", step, create, res, a.Has(ip)))
				for range 3 {
					if got := a.Has(ip); got != server.present {
						t.Fatalf("%s, seed %d: Has() = %v, the server holds %+v:\n%s", mode, seed, got, server, strings.Join(trace, "\n"))
					}
					lag()
				}
			}
		}
	}
}
