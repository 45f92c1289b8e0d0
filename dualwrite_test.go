package clusterip

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

func alreadyExists(ip string) error {
	return apierrors.NewAlreadyExists(networkingv1.Resource("ipaddresses"), ip)
}

// lastIndex returns the position of the last journal entry equal to e, or -1.
func lastIndex(entries []string, e string) int {
	for i := len(entries) - 1; i >= 0; i-- {
		if entries[i] == e {
			return i
		}
	}
	return -1
}

// indexOf returns the position of the first journal entry with the prefix, or -1.
func indexOf(entries []string, prefix string) int {
	return slices.IndexFunc(entries, func(e string) bool { return strings.HasPrefix(e, prefix) })
}

func TestDualWriteAllocateNextSetsBitBeforeIPAddress(t *testing.T) {
	f := newDualFixture(t, "10.0.0.0/24")
	ip, err := f.dw.AllocateNext(f.ctx, testOwner)
	if err != nil {
		t.Fatalf("AllocateNext() = %v", err)
	}
	if got, want := f.bits(), []netip.Addr{ip}; !slices.Equal(got, want) {
		t.Errorf("bits = %v, want %v", got, want)
	}
	if got := f.objects(); !slices.Equal(got, []netip.Addr{ip}) {
		t.Errorf("IPAddress objects = %v, want [%v]", got, ip)
	}
	log := f.log.get()
	bit, create := indexOf(log, "bitmap ["+ip.String()+"]"), indexOf(log, "create "+ip.String())
	if bit < 0 || create < 0 || bit > create {
		t.Errorf("journal %q: want the bit of %s set before its IPAddress is created", log, ip)
	}
	f.checkInvariant()
}

// TestDualWriteRefusesABadOwnerBeforeAnyBit checks that Allocate and AllocateNext refuse an owner
// without a Resource or a Name with an *allocator.OwnerError before they write a bit, so that a bad
// owner never leaves a bit for repair to free.
func TestDualWriteRefusesABadOwnerBeforeAnyBit(t *testing.T) {
	f := newDualFixture(t, "10.0.0.0/24")
	tests := []struct {
		name  string
		owner allocator.Owner
	}{
		{"zero", allocator.Owner{}},
		{"no name", allocator.Owner{Resource: "services", Namespace: "ns"}},
		{"no resource", allocator.Owner{Namespace: "ns", Name: "web"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := f.store.Stats().Updates
			var oe *allocator.OwnerError
			if err := f.dw.Allocate(f.ctx, netip.MustParseAddr("10.0.0.10"), tt.owner); !errors.As(err, &oe) {
				t.Errorf("Allocate(10.0.0.10, %+v) = %v, want an *allocator.OwnerError", tt.owner, err)
			}
			if ip, err := f.dw.AllocateNext(f.ctx, tt.owner); !errors.As(err, &oe) || ip.IsValid() {
				t.Errorf("AllocateNext(%+v) = %v, %v, want the zero Addr and an *allocator.OwnerError", tt.owner, ip, err)
			}
			if got := f.store.Stats().Updates; got != before {
				t.Errorf("bitmap writes = %d, want %d (none)", got-before, 0)
			}
			if got := f.bits(); len(got) != 0 {
				t.Errorf("bits = %v, want none", got)
			}
			if got := f.objects(); len(got) != 0 {
				t.Errorf("IPAddress objects = %v, want none", got)
			}
		})
	}
}

func TestDualWriteReleaseDeletesIPAddressBeforeBit(t *testing.T) {
	f := newDualFixture(t, "10.0.0.0/24")
	ip, err := f.dw.AllocateNext(f.ctx, testOwner)
	if err != nil {
		t.Fatalf("AllocateNext() = %v", err)
	}
	if err := f.dw.Release(f.ctx, ip); err != nil {
		t.Fatalf("Release(%v) = %v", ip, err)
	}
	log := f.log.get()
	del, cleared := indexOf(log, "delete "+ip.String()), lastIndex(log, "bitmap []")
	if del < 0 || cleared < 0 || del > cleared {
		t.Errorf("journal %q: want the IPAddress of %s deleted before its bit is cleared", log, ip)
	}
	if len(f.bits()) != 0 || len(f.objects()) != 0 {
		t.Errorf("after Release: bits %v, objects %v; want none", f.bits(), f.objects())
	}
	if err := f.dw.Release(f.ctx, ip); err != nil {
		t.Errorf("second Release(%v) = %v, want nil", ip, err)
	}
}

// forbidden is a definite refusal of an IPAddress create: the server stored nothing.
func forbidden(ip string) error {
	return apierrors.NewForbidden(networkingv1.Resource("ipaddresses"), ip, errInjected)
}

// Each write of a dual write fails in turn (an IPAddress create with a definite refusal; see
// TestDualWriteKeepsBitWhenIPAddressCreateIsAmbiguous for the others); whatever fails, the two
// stores agree afterwards.
func TestDualWriteUndoesHalfDoneWrites(t *testing.T) {
	ip := netip.MustParseAddr("10.0.0.20")
	tests := []struct {
		name       string
		op         string // "allocate", "allocateNext" or "release"
		failCreate bool
		failDelete bool
		failBitmap bool
		wantHeld   bool // whether ip (for allocate and release) is held in both stores afterwards
	}{
		{name: "Allocate: bitmap write fails", op: "allocate", failBitmap: true},
		{name: "Allocate: IPAddress create refused", op: "allocate", failCreate: true},
		{name: "AllocateNext: bitmap write fails", op: "allocateNext", failBitmap: true},
		{name: "AllocateNext: IPAddress create refused", op: "allocateNext", failCreate: true},
		{name: "Release: IPAddress delete fails", op: "release", failDelete: true, wantHeld: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newDualFixture(t, "10.0.0.0/24")
			if tt.op == "release" {
				if err := f.dw.Allocate(f.ctx, ip, testOwner); err != nil {
					t.Fatalf("Allocate(%v) = %v", ip, err)
				}
			}
			if tt.failCreate {
				f.setFailCreate(func(ip string) error { return forbidden(ip) })
			}
			if tt.failDelete {
				f.setFailDelete(func(string) error { return apierrors.NewInternalError(errInjected) })
			}
			if tt.failBitmap {
				f.setFailBitmap(func() error { return errInjected })
			}
			var err error
			switch tt.op {
			case "allocate":
				err = f.dw.Allocate(f.ctx, ip, testOwner)
			case "allocateNext":
				_, err = f.dw.AllocateNext(f.ctx, testOwner)
			case "release":
				err = f.dw.Release(f.ctx, ip)
			}
			if err == nil {
				t.Fatalf("%s with an injected failure = nil, want an error", tt.op)
			}
			f.checkInvariant()
			var want []netip.Addr
			if tt.wantHeld {
				want = []netip.Addr{ip}
			}
			if got := f.objects(); !slices.Equal(got, want) {
				t.Errorf("IPAddress objects = %v, want %v", got, want)
			}
			if got := f.bits(); !slices.Equal(got, want) {
				t.Errorf("bits = %v, want %v", got, want)
			}
			if tt.failCreate && f.dw.Stats().Undone != 1 {
				t.Errorf("Stats().Undone = %d, want 1", f.dw.Stats().Undone)
			}
			if tt.failBitmap && slices.ContainsFunc(f.log.get(), func(e string) bool { return strings.HasPrefix(e, "create") }) {
				t.Errorf("journal %q: an IPAddress was created although its bit could not be set", f.log.get())
			}
		})
	}
}

func TestDualWriteReleaseKeepsIPAddressDeletedWhenBitCannotBeCleared(t *testing.T) {
	f := newDualFixture(t, "10.0.0.0/24")
	ip := netip.MustParseAddr("10.0.0.20")
	if err := f.dw.Allocate(f.ctx, ip, testOwner); err != nil {
		t.Fatalf("Allocate(%v) = %v", ip, err)
	}
	f.setFailBitmap(func() error { return errInjected })
	if err := f.dw.Release(f.ctx, ip); err == nil {
		t.Fatal("Release() with the bitmap failing = nil, want an error")
	}
	// A bit without an IPAddress object: a leak, never a duplicate. A retry clears it.
	if got, want := f.bits(), []netip.Addr{ip}; !slices.Equal(got, want) {
		t.Errorf("bits = %v, want %v", got, want)
	}
	if got := f.objects(); len(got) != 0 {
		t.Errorf("IPAddress objects = %v, want none", got)
	}
	f.setFailBitmap(nil)
	if err := f.dw.Release(f.ctx, ip); err != nil {
		t.Fatalf("retried Release() = %v", err)
	}
	f.checkInvariant()
}

func TestDualWriteNeverTakesOverALegacyBit(t *testing.T) {
	f := newDualFixture(t, "10.0.0.0/24")
	legacy := netip.MustParseAddr("10.0.0.30")
	f.setBits(legacy)
	err := f.dw.Allocate(f.ctx, legacy, testOwner)
	if !errors.Is(err, allocator.ErrAllocated) {
		t.Fatalf("Allocate(legacy bit %v) = %v, want ErrAllocated", legacy, err)
	}
	if got := f.objects(); len(got) != 0 {
		t.Errorf("IPAddress objects = %v, want none", got)
	}
	if !f.dw.Has(legacy) {
		t.Errorf("Has(%v) = false, want true for a legacy bit", legacy)
	}
	if err := f.dw.DryRun().Allocate(f.ctx, legacy, testOwner); !errors.Is(err, allocator.ErrAllocated) {
		t.Errorf("DryRun().Allocate(legacy bit) = %v, want ErrAllocated", err)
	}
	f.checkInvariant(legacy)
}

// A peer that frees the bit before deleting its IPAddress object (kube-apiserver v1.33 does)
// leaves a free bit whose address is still taken: AllocateNext skips it, and never fails for it.
func TestDualWriteAllocateNextSkipsAddressWhoseIPAddressStillExists(t *testing.T) {
	f := newDualFixture(t, "10.0.0.0/29") // 6 addresses
	var skipped []string
	f.setFailCreate(func(ip string) error {
		if len(skipped) < 3 {
			skipped = append(skipped, ip)
			return alreadyExists(ip)
		}
		return nil
	})
	ip, err := f.dw.AllocateNext(f.ctx, testOwner)
	if err != nil {
		t.Fatalf("AllocateNext() = %v, want an address", err)
	}
	if slices.Contains(skipped, ip.String()) {
		t.Errorf("AllocateNext() = %v, one of the addresses whose IPAddress exists %v", ip, skipped)
	}
	// The primary remembers the three as held, so a later pick of one of them is skipped as well.
	if got := f.dw.Stats().Skipped; got < 3 {
		t.Errorf("Stats().Skipped = %d, want at least 3", got)
	}
	if got, want := f.bits(), []netip.Addr{ip}; !slices.Equal(got, want) {
		t.Errorf("bits = %v, want %v (the skipped ones given back)", got, want)
	}
	f.checkInvariant()
}

func TestDualWriteAllocateNextSkipsAddressThePrimaryKnowsHeld(t *testing.T) {
	f := newDualFixture(t, "10.0.0.0/30") // 2 addresses: .1 and .2
	peer := testenv.IPAddress("10.0.0.1", "default", "peer")
	if _, err := f.client.NetworkingV1().IPAddresses().Create(f.ctx, peer, createOpts); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the primary to see the peer's IPAddress", func() bool { return f.sc.Has(netip.MustParseAddr("10.0.0.1")) })
	for range 5 {
		ip, err := f.dw.AllocateNext(f.ctx, testOwner)
		if err != nil {
			t.Fatalf("AllocateNext() = %v", err)
		}
		if ip != netip.MustParseAddr("10.0.0.2") {
			t.Fatalf("AllocateNext() = %v, want 10.0.0.2", ip)
		}
		if err := f.dw.Release(f.ctx, ip); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.dw.AllocateNext(f.ctx, testOwner); err != nil {
		t.Fatal(err)
	}
	if _, err := f.dw.AllocateNext(f.ctx, testOwner); !errors.Is(err, allocator.ErrFull) {
		t.Errorf("AllocateNext() on a full range = %v, want ErrFull", err)
	}
	if got, want := f.bits(), []netip.Addr{netip.MustParseAddr("10.0.0.2")}; !slices.Equal(got, want) {
		t.Errorf("bits = %v, want %v", got, want)
	}
}

// Once the flag range's bitmap is full, addresses come from other ServiceCIDRs, without bits.
func TestDualWriteAllocateNextFallsBackToOtherServiceCIDRsWhenBitmapFull(t *testing.T) {
	f := newDualFixture(t, "10.0.0.0/30", "10.1.0.0/24")
	var inFlag, outside int
	for range 10 {
		ip, err := f.dw.AllocateNext(f.ctx, testOwner)
		if err != nil {
			t.Fatalf("AllocateNext() = %v", err)
		}
		if f.dw.InWindow(ip) {
			inFlag++
		} else {
			outside++
		}
	}
	if inFlag != 2 || outside != 8 {
		t.Errorf("AllocateNext x10 gave %d addresses in the flag range and %d outside, want 2 and 8", inFlag, outside)
	}
	if got := len(f.bits()); got != 2 {
		t.Errorf("bits set = %d, want 2", got)
	}
	f.checkInvariant()
}

// A legacy peer holds every free bit: the primary offers those addresses, and they are refused.
func TestDualWriteAllocateNextFullWhenLegacyHoldsTheRest(t *testing.T) {
	f := newDualFixture(t, "10.0.0.0/30")
	legacy := netip.MustParseAddr("10.0.0.1")
	f.setBits(legacy)
	ip, err := f.dw.AllocateNext(f.ctx, testOwner)
	if err != nil || ip != netip.MustParseAddr("10.0.0.2") {
		t.Fatalf("AllocateNext() = %v, %v; want 10.0.0.2", ip, err)
	}
	if _, err := f.dw.AllocateNext(f.ctx, testOwner); !errors.Is(err, allocator.ErrFull) {
		t.Errorf("AllocateNext() = %v, want ErrFull", err)
	}
	f.checkInvariant(legacy)
}

// IPv6 flag ranges wider than the bitmap's 65535 slots: addresses above them live in the primary
// alone (kubernetes#129797).
func TestDualWriteIPv6BeyondBitmapGoesToPrimaryOnly(t *testing.T) {
	f := newDualFixture(t, "fd00::/108")
	tests := []struct {
		ip       string
		inWindow bool
	}{
		{"fd00::1", true},
		{"fd00::ffff", true},
		{"fd00::1:0", false},
		{"fd00::f:ffff", false},
	}
	for _, tt := range tests {
		ip := netip.MustParseAddr(tt.ip)
		if got := f.dw.InWindow(ip); got != tt.inWindow {
			t.Errorf("InWindow(%v) = %t, want %t", ip, got, tt.inWindow)
		}
		if err := f.dw.Allocate(f.ctx, ip, testOwner); err != nil {
			t.Fatalf("Allocate(%v) = %v", ip, err)
		}
	}
	if got, want := f.bits(), []netip.Addr{netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::ffff")}; !slices.Equal(got, want) {
		t.Errorf("bits = %v, want %v", got, want)
	}
	if got := len(f.objects()); got != 4 {
		t.Errorf("IPAddress objects = %d, want 4", got)
	}
	if got := slices.Collect(f.dw.All()); len(got) != 4 {
		t.Errorf("All() = %v, want 4 addresses", got)
	}
	for _, tt := range tests {
		if err := f.dw.Release(f.ctx, netip.MustParseAddr(tt.ip)); err != nil {
			t.Errorf("Release(%s) = %v", tt.ip, err)
		}
	}
	f.checkInvariant()
	if len(f.objects()) != 0 || len(f.bits()) != 0 {
		t.Errorf("after Release: objects %v, bits %v", f.objects(), f.bits())
	}
}

// The flag range is in no ServiceCIDR (its default ServiceCIDR was deleted): bits taken for it
// are given back, and addresses come from the ServiceCIDRs there are.
func TestDualWriteFlagRangeWithoutServiceCIDR(t *testing.T) {
	f := newDualFixtureServing(t, "10.0.0.0/24", "10.1.0.0/24")
	ip, err := f.dw.AllocateNext(f.ctx, testOwner)
	if err != nil {
		t.Fatalf("AllocateNext() = %v", err)
	}
	if !netip.MustParsePrefix("10.1.0.0/24").Contains(ip) {
		t.Errorf("AllocateNext() = %v, want an address of 10.1.0.0/24", ip)
	}
	err = f.dw.Allocate(f.ctx, netip.MustParseAddr("10.0.0.5"), testOwner)
	if !errors.Is(err, allocator.ErrMismatchedNetwork) {
		t.Errorf("Allocate(10.0.0.5) = %v, want an error matching ErrMismatchedNetwork", err)
	}
	if got := f.bits(); len(got) != 0 {
		t.Errorf("bits = %v, want none", got)
	}
	f.checkInvariant()
}

func TestNewDualWriteRejectsMismatchedAllocators(t *testing.T) {
	v4, _ := bitmap.New(netip.MustParsePrefix("10.0.0.0/24"))
	v6, _ := bitmap.New(netip.MustParsePrefix("fd00::/120"))
	if _, err := NewDualWrite(v4, v6); err == nil {
		t.Error("NewDualWrite(IPv4 primary, IPv6 mirror) = nil error, want one")
	}
	if _, err := NewDualWrite(nil, v4); err == nil {
		t.Error("NewDualWrite(nil, mirror) = nil error, want one")
	}
}

func TestMergeSortedYieldsUnionOnce(t *testing.T) {
	a := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.3"), netip.MustParseAddr("10.0.0.5")}
	b := []netip.Addr{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3"), netip.MustParseAddr("10.0.0.9")}
	got := slices.Collect(mergeSorted(slices.Values(a), slices.Values(b)))
	want := []netip.Addr{a[0], b[0], a[1], a[2], b[2]}
	if !slices.Equal(got, want) {
		t.Errorf("mergeSorted() = %v, want %v", got, want)
	}
}

// ambiguousCreate makes the fake API server answer the first create of an IPAddress ambiguously:
// it stores the object first when stored is set, then returns what answer returns. It returns the
// name of the object whose create was answered so once it has happened.
func ambiguousCreate(f *dualFixture, stored bool, answer func() error) func() string {
	var mu sync.Mutex
	var name string
	f.client.PrependReactor("create", "ipaddresses", func(action k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if name != "" {
			return false, nil, nil
		}
		obj := action.(k8stesting.CreateAction).GetObject().(*networkingv1.IPAddress)
		name = obj.Name
		if stored {
			if err := f.client.Tracker().Create(networkingv1.SchemeGroupVersion.WithResource("ipaddresses"), obj.DeepCopy(), ""); err != nil {
				return true, nil, err
			}
		}
		return true, nil, answer()
	})
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		return name
	}
}

// An IPAddress create whose answer does not say whether the object was stored (a 504, a 500, a
// response lost on the way, the caller's deadline) never has its bit undone: the object may exist,
// and a bit cleared under it would let a Legacy peer hand its address out again. When a read of
// the object shows it stored for the owner, the allocation stands.
func TestDualWriteKeepsBitWhenIPAddressCreateIsAmbiguous(t *testing.T) {
	timeout504 := func(context.CancelFunc) error {
		return apierrors.NewTimeoutError("request did not complete within requested timeout", 0)
	}
	internal500 := func(context.CancelFunc) error { return apierrors.NewInternalError(errInjected) }
	lost := func(context.CancelFunc) error {
		return &url.Error{Op: "Post", URL: "https://127.0.0.1/apis/networking.k8s.io/v1/ipaddresses", Err: io.ErrUnexpectedEOF}
	}
	deadline := func(cancel context.CancelFunc) error {
		cancel() // the caller's deadline passes while the create is on its way
		return &url.Error{Op: "Post", URL: "https://127.0.0.1/apis/networking.k8s.io/v1/ipaddresses", Err: context.DeadlineExceeded}
	}
	tests := []struct {
		name   string
		next   bool // AllocateNext, else Allocate of 10.0.0.20
		stored bool // whether the server stored the object before answering
		answer func(cancel context.CancelFunc) error
	}{
		{name: "Allocate: 504 after storing", stored: true, answer: timeout504},
		{name: "Allocate: 500 after storing", stored: true, answer: internal500},
		{name: "Allocate: response lost after storing", stored: true, answer: lost},
		{name: "Allocate: caller's deadline after storing", stored: true, answer: deadline},
		{name: "Allocate: 504 without storing", answer: timeout504},
		{name: "AllocateNext: 504 after storing", next: true, stored: true, answer: timeout504},
		{name: "AllocateNext: response lost after storing", next: true, stored: true, answer: lost},
		{name: "AllocateNext: caller's deadline after storing", next: true, stored: true, answer: deadline},
		{name: "AllocateNext: caller's deadline without storing", next: true, answer: deadline},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newDualFixture(t, "10.0.0.0/24")
			ctx, cancel := context.WithCancel(f.ctx)
			defer cancel()
			answered := ambiguousCreate(f, tt.stored, func() error { return tt.answer(cancel) })
			var kept []netip.Addr
			ctx = WithDualWriteTrace(ctx, &DualWriteTrace{BitKept: func(ip netip.Addr) { kept = append(kept, ip) }})
			var err error
			ip := netip.MustParseAddr("10.0.0.20")
			if tt.next {
				var got netip.Addr
				got, err = f.dw.AllocateNext(ctx, testOwner)
				if err == nil && got.String() != answered() {
					t.Errorf("AllocateNext() = %v, want the address whose create was answered ambiguously, %s", got, answered())
				}
			} else {
				err = f.dw.Allocate(ctx, ip, testOwner)
			}
			if answered() == "" {
				t.Fatalf("no IPAddress create reached the API server (err %v)", err)
			}
			ip = netip.MustParseAddr(answered())
			t.Logf("error: %v; %+v", err, f.dw.Stats())
			if tt.stored && err != nil {
				t.Errorf("the object was stored for the owner, yet the allocation failed: %v", err)
			}
			if !tt.stored && err == nil {
				t.Errorf("the object was never stored, yet the allocation succeeded")
			}
			if !slices.Contains(f.bits(), ip) {
				t.Errorf("bits = %v: the bit of %s was cleared although its IPAddress create was ambiguous", f.bits(), ip)
			}
			// A bit left set for an allocation that did not stand is reported to the trace.
			var wantKept []netip.Addr
			if err != nil {
				wantKept = []netip.Addr{ip}
			}
			if !slices.Equal(kept, wantKept) {
				t.Errorf("bits kept, as the trace reports them = %v, want %v", kept, wantKept)
			}
			if got := slices.Contains(f.objects(), ip); got != tt.stored {
				t.Errorf("IPAddress %s exists = %t, want %t", ip, got, tt.stored)
			}
			// A Legacy peer, which reads only the bitmap, cannot take the address.
			legacy, lerr := bitmap.NewPersistent(f.ctx, f.flag, f.store)
			if lerr != nil {
				t.Fatal(lerr)
			}
			defer legacy.Close()
			if err := legacy.Allocate(f.ctx, ip, allocator.Owner{}); !errors.Is(err, allocator.ErrAllocated) {
				t.Errorf("a Legacy peer's Allocate(%s) = %v, want ErrAllocated", ip, err)
			}
			if tt.stored {
				f.checkInvariant()
			}
		})
	}
}

// The flag range's bits are all held by a Legacy peer's Services (no IPAddress objects), and an
// extra ServiceCIDR has room: every AllocateNext is served from it until it is full, and none
// costs an IPAddress create in the flag range.
func TestDualWriteAllocateNextServesOtherServiceCIDRWhenLegacyHoldsFlagRange(t *testing.T) {
	f := newDualFixture(t, "10.0.0.0/24", "10.1.0.0/28")
	var legacy []netip.Addr
	for ip := netip.MustParseAddr("10.0.0.1"); ip != netip.MustParseAddr("10.0.0.255"); ip = ip.Next() {
		legacy = append(legacy, ip)
	}
	f.setBits(legacy...)
	extra := netip.MustParsePrefix("10.1.0.0/28")
	var got []netip.Addr
	for i := range 14 {
		ip, err := f.dw.AllocateNext(f.ctx, testOwner)
		if err != nil {
			t.Fatalf("AllocateNext() #%d = %v, want an address of %s (%+v)", i+1, err, extra, f.dw.Stats())
		}
		if !extra.Contains(ip) {
			t.Errorf("AllocateNext() #%d = %v, want an address of %s", i+1, ip, extra)
		}
		got = append(got, ip)
		if i == 0 { // the bitmap mirror has read the Legacy peer's bits by now
			for j := range 20 {
				if ip, err := f.dw.DryRun().AllocateNext(f.ctx, testOwner); err != nil || !extra.Contains(ip) {
					t.Fatalf("DryRun().AllocateNext() #%d = %v, %v; want an address of %s", j+1, ip, err, extra)
				}
			}
		}
	}
	slices.SortFunc(got, netip.Addr.Compare)
	if n := len(slices.Compact(got)); n != 14 {
		t.Errorf("AllocateNext() handed out %d distinct addresses in 14 calls, want 14", n)
	}
	if _, err := f.dw.AllocateNext(f.ctx, testOwner); !errors.Is(err, allocator.ErrFull) {
		t.Errorf("AllocateNext() with both full = %v, want ErrFull", err)
	}
	creates := 0
	for _, e := range f.log.get() {
		if strings.HasPrefix(e, "create 10.0.0.") {
			creates++
		}
	}
	if creates != 0 {
		t.Errorf("%d IPAddress creates in the flag range, whose bits a Legacy peer holds; want 0", creates)
	}
	f.checkInvariant(legacy...)
}

func TestDualWriteServesTheRestOfAnIPv6FlagRangeWiderThanTheBitmap(t *testing.T) {
	// The bitmap of a /108 has slots for its first 65535 addresses only; the rest of the flag
	// range's ServiceCIDR lives in the primary alone, and a full bitmap must not hide it.
	f := newDualFixture(t, "fd00:10:96::/108")
	slots := make([]netip.Addr, 0, bitmap.MaxIPv6Slots)
	for ip := netip.MustParseAddr("fd00:10:96::1"); len(slots) < bitmap.MaxIPv6Slots; ip = ip.Next() {
		slots = append(slots, ip)
	}
	f.setBits(slots...)
	last := slots[len(slots)-1]
	for i := range 5 {
		ip, err := f.dw.AllocateNext(f.ctx, testOwner)
		if err != nil {
			t.Fatalf("AllocateNext() #%d with the bitmap full = %v, want an address of the flag range past %s", i+1, err, last)
		}
		if !f.flag.Contains(ip) || !last.Less(ip) {
			t.Errorf("AllocateNext() #%d = %v, want an address of %s past %s", i+1, ip, f.flag, last)
		}
	}
}

// stalePrimary is a primary whose informer still shows the IPAddress object of stale, an address a
// peer has freed: Has answers true for it, and, if asked is not nil, the first time it is asked
// Has closes asked and waits (at most 10 s) for resume, so that a test can act while the caller
// of Has is between the two. Every other call goes to the primary underneath, a servicecidr
// allocator. Close leaves that primary open.
type stalePrimary struct {
	allocator.Interface
	stale  netip.Addr
	once   sync.Once
	asked  chan struct{}
	resume chan struct{}
}

func (s *stalePrimary) Has(ip netip.Addr) bool {
	if ip != s.stale {
		return s.Interface.Has(ip)
	}
	s.once.Do(func() {
		if s.asked == nil {
			return
		}
		close(s.asked)
		select {
		case <-s.resume:
		case <-time.After(10 * time.Second):
		}
	})
	return true
}

func (s *stalePrimary) Close() error { return nil }

// AllocateNextOutside is that of the servicecidr primary underneath, which does not know that
// stale is free either: it offers no address of the window p.
func (s *stalePrimary) AllocateNextOutside(ctx context.Context, owner allocator.Owner, p netip.Prefix) (netip.Addr, error) {
	return s.Interface.(outsideAllocator).AllocateNextOutside(ctx, owner, p)
}

// TestDualWriteAllocateNextNotFullWhileAPeerSkipsTheFreeAddress replays the interleaving that the
// 5-minute finish history of 2026-11-27 refused as full: a range with one free address, 10.0.0.1,
// whose IPAddress object a peer's informer still shows. The peer's AllocateNext must not hold that
// address's bit while it decides to skip it, since a caller that reads the bitmap meanwhile would
// find the range full and answer ErrFull while an address is free.
func TestDualWriteAllocateNextNotFullWhileAPeerSkipsTheFreeAddress(t *testing.T) {
	f := newDualFixture(t, "10.0.0.0/30") // 10.0.0.1 and 10.0.0.2
	free, held := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	if err := f.dw.Allocate(f.ctx, held, testOwner); err != nil {
		t.Fatalf("Allocate(%v) = %v", held, err)
	}
	primary := &stalePrimary{Interface: f.sc, stale: free, asked: make(chan struct{}), resume: make(chan struct{})}
	mirror, err := bitmap.NewPersistent(f.ctx, f.flag, f.store)
	if err != nil {
		t.Fatalf("NewPersistent() = %v", err)
	}
	peer, err := NewDualWrite(primary, mirror, WithClient(f.client))
	if err != nil {
		t.Fatalf("NewDualWrite() = %v", err)
	}
	t.Cleanup(func() { _ = peer.Close() })

	type result struct {
		ip  netip.Addr
		err error
	}
	peerDone := make(chan result, 1)
	go func() {
		ip, err := peer.AllocateNext(f.ctx, allocator.Owner{Resource: "services", Namespace: "default", Name: "peer"})
		peerDone <- result{ip, err}
	}()
	select {
	case <-primary.asked:
	case <-time.After(10 * time.Second):
		t.Fatal("the peer's AllocateNext never asked its primary about the free address")
	}
	// The peer is deciding to skip 10.0.0.1; the range has a free address all along.
	ip, err := f.dw.AllocateNext(f.ctx, testOwner)
	close(primary.resume)
	if err != nil || ip != free {
		t.Errorf("AllocateNext() while a peer skips %v = %v, %v; want %v (bits then: %v)", free, ip, err, free, f.describeBits())
	}
	r := <-peerDone
	if r.err == nil {
		t.Errorf("peer AllocateNext() = %v, want ErrFull: both addresses are held", r.ip)
	} else if !errors.Is(r.err, allocator.ErrFull) {
		t.Errorf("peer AllocateNext() = %v, want ErrFull", r.err)
	}
	f.checkInvariant()
}

// TestDualWriteAllocateNextConfirmsAddressesThePrimaryWronglyHolds checks the other side of the
// same interleaving: the caller is the one whose primary's informer still shows the object of
// the free address. AllocateNext passes the address over, finds the range full, and before it
// answers ErrFull reads the object: it is gone, so the address is allocated. Without a client to
// read it, ErrFull stays the answer (the documented default).
func TestDualWriteAllocateNextConfirmsAddressesThePrimaryWronglyHolds(t *testing.T) {
	tests := []struct {
		name       string
		withClient bool
		wantFull   bool
	}{
		{name: "with a client: the read shows it free", withClient: true},
		{name: "without a client", wantFull: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newDualFixture(t, "10.0.0.0/30")
			free, held := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
			if err := f.dw.Allocate(f.ctx, held, testOwner); err != nil {
				t.Fatalf("Allocate(%v) = %v", held, err)
			}
			var opts []DualWriteOption
			if tt.withClient {
				opts = append(opts, WithClient(f.client))
			}
			dw, err := NewDualWrite(&stalePrimary{Interface: f.sc, stale: free}, f.bm, opts...)
			if err != nil {
				t.Fatalf("NewDualWrite() = %v", err)
			}
			ip, err := dw.AllocateNext(f.ctx, testOwner)
			if tt.wantFull {
				if !errors.Is(err, allocator.ErrFull) {
					t.Errorf("AllocateNext() = %v, %v; want ErrFull", ip, err)
				}
				if got, want := f.bits(), []netip.Addr{held}; !slices.Equal(got, want) {
					t.Errorf("bits = %v, want %v: the skipped address's bit never set", got, want)
				}
				return
			}
			if err != nil || ip != free {
				t.Fatalf("AllocateNext() = %v, %v; want %v", ip, err, free)
			}
			if got := dw.Stats().Undone; got != 0 {
				t.Errorf("Stats().Undone = %d, want 0: no bit taken and given back", got)
			}
			f.checkInvariant()
		})
	}
}

// releaseHook is a primary without AllocateNextOutside (so that it offers addresses of the
// window) that calls onRelease after each Release. Close leaves the primary underneath open.
type releaseHook struct {
	allocator.Interface
	mu        sync.Mutex
	releases  int
	onRelease func(n int)
}

func (r *releaseHook) Release(ctx context.Context, ip netip.Addr) error {
	err := r.Interface.Release(ctx, ip)
	r.mu.Lock()
	r.releases++
	n := r.releases
	r.mu.Unlock()
	r.onRelease(n)
	return err
}

func (r *releaseHook) Close() error { return nil }

// TestDualWriteAllocateNextRetriesAnOfferedAddressWhoseBitWasGivenBack checks that a bit a peer
// holds for a moment does not make AllocateNext answer ErrFull: the primary offers the free
// address, whose bit is set every time it is tried, and the peer clears it as AllocateNext gives
// up; before answering ErrFull, AllocateNext reads the bitmap again and takes the address.
func TestDualWriteAllocateNextRetriesAnOfferedAddressWhoseBitWasGivenBack(t *testing.T) {
	f := newDualFixture(t, "10.0.0.0/30")
	free, held := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	if err := f.dw.Allocate(f.ctx, held, testOwner); err != nil {
		t.Fatalf("Allocate(%v) = %v", held, err)
	}
	f.setBits(free) // the peer's bit, without an object
	primary := &releaseHook{Interface: f.sc, onRelease: func(n int) {
		if n == maxFallbacks { // the undo of the last address offered: the peer gives its bit back
			f.clearBits(free)
		}
	}}
	dw, err := NewDualWrite(primary, f.bm, WithClient(f.client))
	if err != nil {
		t.Fatalf("NewDualWrite() = %v", err)
	}
	ip, err := dw.AllocateNext(f.ctx, testOwner)
	if err != nil || ip != free {
		t.Fatalf("AllocateNext() = %v, %v; want %v (stats %+v)", ip, err, free, dw.Stats())
	}
	if got := dw.Stats().Refused; got != maxFallbacks {
		t.Errorf("Stats().Refused = %d, want %d", got, maxFallbacks)
	}
	f.checkInvariant()
}

// TestDualWriteAllocateNextNotFullWhileAPeerHoldsABitItWillGiveBack replays the interleaving that
// the finish history stops at (issue 38 item 1): a range with one free address, 10.0.0.1, whose bit
// a peer's dual write holds for a moment (its create found an IPAddressOnly peer's object, which
// has been deleted since, and its undo has not landed yet). The caller finds every bit set and no
// ServiceCIDR outside the window; before it answers ErrFull it must find the bit without an
// object, wait for the peer to give it back, and take the address. A bit that stays set (a Legacy
// peer's) is never taken, and the answer is then ErrFull, after a bounded wait.
func TestDualWriteAllocateNextNotFullWhileAPeerHoldsABitItWillGiveBack(t *testing.T) {
	tests := []struct {
		name       string
		givesBack  bool // the peer clears its bit once the caller has seen the range full
		withClient bool
		wantFull   bool
	}{
		{name: "a peer's bit given back while the caller confirms full", givesBack: true, withClient: true},
		{name: "a Legacy peer's bit that stays", withClient: true, wantFull: true},
		{name: "without a client to read the objects", givesBack: true, wantFull: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newDualFixture(t, "10.0.0.0/30") // 10.0.0.1 and 10.0.0.2
			free, held := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
			if err := f.dw.Allocate(f.ctx, held, testOwner); err != nil {
				t.Fatalf("Allocate(%v) = %v", held, err)
			}
			f.setBits(free) // the peer's bit, with no object
			var gaveBack atomic.Bool
			if tt.givesBack {
				// The peer's undo lands once the caller has found the range full and reads the
				// objects to confirm it (or, without a client, at once: the caller must still
				// answer as before).
				giveBack := func() {
					if !gaveBack.Swap(true) {
						f.clearBits(free)
					}
				}
				f.client.PrependReactor("list", "ipaddresses", func(k8stesting.Action) (bool, runtime.Object, error) {
					giveBack()
					return false, nil, nil
				})
				if !tt.withClient {
					t.Cleanup(giveBack)
				}
			}
			var opts []DualWriteOption
			if tt.withClient {
				opts = append(opts, WithClient(f.client))
			}
			dw, err := NewDualWrite(f.sc, f.bm, opts...)
			if err != nil {
				t.Fatalf("NewDualWrite() = %v", err)
			}
			ip, err := dw.AllocateNext(f.ctx, testOwner)
			if tt.wantFull {
				if !errors.Is(err, allocator.ErrFull) {
					t.Errorf("AllocateNext() = %v, %v; want ErrFull", ip, err)
				}
				if got := f.objects(); !slices.Equal(got, []netip.Addr{held}) {
					t.Errorf("IPAddress objects = %v, want only %v: nothing taken", got, held)
				}
				return
			}
			if err != nil || ip != free {
				t.Fatalf("AllocateNext() = %v, %v; want %v (bits then: %v)", ip, err, free, f.describeBits())
			}
			f.checkInvariant()
		})
	}
}

// TestDualWriteFullWindowListsAreShared checks that callers that find the window full behind a
// bit without an object (here a Legacy peer's, which stays) share the List that reads the
// objects: a tenant who keeps creating Services against a full range costs the API server one
// List at a time, not one per create. Callers that come while a List is in flight do not use it
// (it may show what the server held before they were called): they share the next one.
func TestDualWriteFullWindowListsAreShared(t *testing.T) {
	f := newDualFixture(t, "10.0.0.0/30") // 10.0.0.1 and 10.0.0.2
	held, legacy := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.1")
	if err := f.dw.Allocate(f.ctx, held, testOwner); err != nil {
		t.Fatalf("Allocate(%v) = %v", held, err)
	}
	testenv.WaitFor(t, "the informer to show "+held.String(), func() bool { return f.sc.Has(held) })
	f.setBits(legacy) // a Legacy peer's bit, with no object
	var lists atomic.Int32
	release := make(chan struct{})
	tracker := f.client.Tracker()
	f.client.PrependReactor("list", "ipaddresses", func(action k8stesting.Action) (bool, runtime.Object, error) {
		lists.Add(1)
		obj, err := tracker.List(action.GetResource(), action.(k8stesting.ListActionImpl).GetKind(), "")
		<-release
		return true, obj, err
	})
	dw, err := NewDualWrite(f.sc, f.bm, WithClient(f.client))
	if err != nil {
		t.Fatalf("NewDualWrite() = %v", err)
	}
	call := func() <-chan error {
		ch := make(chan error, 1)
		go func() {
			_, err := dw.AllocateNext(f.ctx, testOwner)
			ch <- err
		}()
		return ch
	}
	first := call()
	testenv.WaitFor(t, "the first List", func() bool { return lists.Load() == 1 })
	const later = 7
	results := []<-chan error{first}
	for range later {
		results = append(results, call())
	}
	testenv.WaitFor(t, "the later callers waiting for the List in flight", func() bool { return dw.objects.Waiting() == later })
	release <- struct{}{} // the first List answers; one later caller starts the next
	testenv.WaitFor(t, "the second List, and the other later callers waiting for it", func() bool {
		return lists.Load() == 2 && dw.objects.Waiting() == later-1
	})
	close(release) // every List answers at once from now on
	for i, ch := range results {
		if err := <-ch; !errors.Is(err, allocator.ErrFull) {
			t.Errorf("caller %d: AllocateNext() = %v; want ErrFull", i, err)
		}
	}
	if got := lists.Load(); got != 2 {
		t.Errorf("%d Lists for %d callers of a full window, want 2: the first caller's, and one the %d later callers share", got, later+1, later)
	}
	if got := f.objects(); !slices.Equal(got, []netip.Addr{held}) {
		t.Errorf("IPAddress objects = %v, want only %v: nothing taken", got, held)
	}
}

// TestDualWriteAllocateNextFullWithoutAListWhenEveryBitHasAnObject checks that a window full of
// dual writes, every bit with its IPAddress object, answers ErrFull without reading the objects
// from the API server: the List of the wait for bits given back is only for bits without one.
func TestDualWriteAllocateNextFullWithoutAListWhenEveryBitHasAnObject(t *testing.T) {
	f := newDualFixture(t, "10.0.0.0/30")
	for _, ip := range []string{"10.0.0.1", "10.0.0.2"} {
		if err := f.dw.Allocate(f.ctx, netip.MustParseAddr(ip), testOwner); err != nil {
			t.Fatalf("Allocate(%s) = %v", ip, err)
		}
	}
	testenv.WaitFor(t, "the informer to show both objects", func() bool {
		return f.sc.Has(netip.MustParseAddr("10.0.0.1")) && f.sc.Has(netip.MustParseAddr("10.0.0.2"))
	})
	var lists atomic.Int32
	f.client.PrependReactor("list", "ipaddresses", func(k8stesting.Action) (bool, runtime.Object, error) {
		lists.Add(1)
		return false, nil, nil
	})
	dw, err := NewDualWrite(f.sc, f.bm, WithClient(f.client))
	if err != nil {
		t.Fatalf("NewDualWrite() = %v", err)
	}
	if ip, err := dw.AllocateNext(f.ctx, testOwner); !errors.Is(err, allocator.ErrFull) {
		t.Errorf("AllocateNext() = %v, %v; want ErrFull", ip, err)
	}
	if n := lists.Load(); n != 0 {
		t.Errorf("AllocateNext() listed the IPAddress objects %d times, want none", n)
	}
}

// TestDualWriteTraceReportsTheBitsACallGivesBack checks that a call made with a DualWriteTrace
// reports each address whose bit it set and cleared again, and nothing else: in a window whose
// one free address is 10.0.0.1, an AllocateNext whose first create is refused (the object was
// there) reports it and then takes it; an Allocate whose create is refused reports its address;
// a call that takes its first pick reports nothing.
func TestDualWriteTraceReportsTheBitsACallGivesBack(t *testing.T) {
	free, held := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	tests := []struct {
		name     string
		refusals int // how many creates of free are refused (AlreadyExists)
		call     func(ctx context.Context, dw *DualWriteAllocator) (netip.Addr, error)
		wantErr  error
		wantBack []netip.Addr
	}{
		{"an AllocateNext whose first create is refused", 1,
			func(ctx context.Context, dw *DualWriteAllocator) (netip.Addr, error) {
				return dw.AllocateNext(ctx, testOwner)
			},
			nil, []netip.Addr{free}},
		{"an Allocate whose create is refused", 1,
			func(ctx context.Context, dw *DualWriteAllocator) (netip.Addr, error) {
				return free, dw.Allocate(ctx, free, testOwner)
			},
			allocator.ErrAllocated, []netip.Addr{free}},
		{"an AllocateNext that takes its first pick", 0,
			func(ctx context.Context, dw *DualWriteAllocator) (netip.Addr, error) {
				return dw.AllocateNext(ctx, testOwner)
			},
			nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newDualFixture(t, "10.0.0.0/30") // 10.0.0.1 and 10.0.0.2
			if err := f.dw.Allocate(f.ctx, held, testOwner); err != nil {
				t.Fatalf("Allocate(%v) = %v", held, err)
			}
			refusals := tt.refusals
			f.setFailCreate(func(ip string) error {
				if ip == free.String() && refusals > 0 {
					refusals--
					return apierrors.NewAlreadyExists(networkingv1.Resource("ipaddresses"), ip)
				}
				return nil
			})
			var back []netip.Addr
			ctx := WithDualWriteTrace(f.ctx, &DualWriteTrace{BitGivenBack: func(ip netip.Addr) { back = append(back, ip) }})
			ip, err := tt.call(ctx, f.dw)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Errorf("call = %v, %v; want %v", ip, err, tt.wantErr)
				}
				if f.bm.Has(free) {
					t.Errorf("the bit of %v is still set", free)
				}
			} else if err != nil || ip != free {
				t.Errorf("call = %v, %v; want %v", ip, err, free)
			}
			if !slices.Equal(back, tt.wantBack) {
				t.Errorf("bits given back = %v, want %v", back, tt.wantBack)
			}
		})
	}
}
