package allocatortest

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/ipmath"
)

// Factory returns a new, empty allocator serving cidr that is ready to allocate. It registers any
// cleanup with t and fails t if it cannot build one.
type Factory func(t *testing.T, cidr netip.Prefix) allocator.Interface

// Option adjusts the suite to an implementation.
type Option func(*config)

type config struct {
	multiCIDR     bool
	recordsOwners bool
	workers       int
}

// MultiCIDR declares that the allocator serves several ranges and so returns the zero Prefix from
// CIDR() and a range-less *allocator.NotInRangeError for addresses outside them.
func MultiCIDR() Option { return func(c *config) { c.multiCIDR = true } }

// RecordsOwners declares that the allocator records each address's Owner (as the parentRef of an
// IPAddress object), and so must reject an Owner without a Resource or a Name with an
// *allocator.OwnerError before storing anything (see allocator.CheckOwner). Without it the suite
// skips its owner checks, and every call uses a valid Owner.
func RecordsOwners() Option { return func(c *config) { c.recordsOwners = true } }

// Workers sets how many goroutines the concurrency tests run. Default 8; n < 1 keeps the default.
func Workers(n int) Option {
	return func(c *config) {
		if n >= 1 {
			c.workers = n
		}
	}
}

// Ranges the suite uses. Each is small and avoids the 10.96.0.0/12 default Service range.
var (
	v4Small = netip.MustParsePrefix("192.168.77.0/28") // 14 addresses, no static band
	v4Band  = netip.MustParsePrefix("192.168.78.0/27") // 30 addresses, static band of 16
	v4Wide  = netip.MustParsePrefix("192.168.79.0/26") // 62 addresses, static band of 16
	v6Small = netip.MustParsePrefix("fd00:77::/124")   // 15 addresses, no static band
	v6Band  = netip.MustParsePrefix("fd00:78::/122")   // 63 addresses, static band of 16
	v4One   = netip.MustParsePrefix("192.168.80.0/30") // 2 addresses
	v6One   = netip.MustParsePrefix("fd00:80::/127")   // 1 address: the all-ones one
)

// Run runs the conformance suite as subtests of t. A nil f, or a Factory that returns a nil
// allocator, fails t instead of panicking; nil Options are ignored.
func Run(t *testing.T, f Factory, opts ...Option) {
	t.Helper()
	if f == nil {
		t.Fatal("allocatortest: Run needs a Factory, got nil")
	}
	f = checked(f)
	c := config{workers: 8}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	tests := []struct {
		name string
		fn   func(t *testing.T, f Factory, c config)
	}{
		{"Metadata", testMetadata},
		{"ExhaustThenFull", testExhaust},
		{"ReleaseAndReuse", testReleaseAndReuse},
		{"AllocateSpecific", testAllocateSpecific},
		{"NotInRange", testNotInRange},
		{"BadInputChangesNothing", testBadInput},
		{"UpperBandFirst", testBandOrder},
		{"UsedFreeAccounting", testAccounting},
		{"AllEqualsAllocated", testAll},
		{"DryRunChangesNothing", testDryRun},
		{"ConcurrentAllocateNextUnique", testConcurrentNext},
		{"ConcurrentAllocateSameIPOneWinner", testConcurrentSame},
		{"SmallestRanges", testSmallest},
		{"InvalidOwnerChangesNothing", testInvalidOwner},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, f, c) })
	}
}

// checked wraps f so that a nil allocator fails the test at once.
func checked(f Factory) Factory {
	return func(t *testing.T, cidr netip.Prefix) allocator.Interface {
		t.Helper()
		a := f(t, cidr)
		if a == nil {
			t.Fatalf("allocatortest: the Factory returned a nil allocator for %v", cidr)
		}
		if v := reflect.ValueOf(a); v.Kind() == reflect.Pointer && v.IsNil() {
			t.Fatalf("allocatortest: the Factory returned a nil %T for %v", a, cidr)
		}
		return a
	}
}

// owner is a valid Owner, as kube-apiserver requires of a parentRef: it has a Resource and a Name.
var owner = allocator.Owner{Resource: "services", Namespace: "default", Name: "conformance"}

// fill allocates every free address with AllocateNext (see Fill), checks that each is a usable
// address of cidr, and returns them in order.
func fill(t *testing.T, a allocator.Interface, cidr netip.Prefix) []netip.Addr {
	t.Helper()
	got := Fill(t, context.Background(), a, owner)
	for _, ip := range got {
		checkUsable(t, cidr, ip)
	}
	return got
}

func checkUsable(t *testing.T, cidr netip.Prefix, ip netip.Addr) {
	t.Helper()
	if !ipmath.Usable(cidr, ip) {
		t.Fatalf("got %v, which is not a usable address of %v", ip, cidr)
	}
}

func addr(cidr netip.Prefix, off uint64) netip.Addr {
	ip, ok := ipmath.AddrAt(cidr, off)
	if !ok {
		panic("allocatortest: offset out of range")
	}
	return ip
}

func testMetadata(t *testing.T, f Factory, c config) {
	for _, tt := range []struct {
		cidr   netip.Prefix
		family corev1.IPFamily
	}{
		{v4Small, corev1.IPv4Protocol},
		{v6Small, corev1.IPv6Protocol},
	} {
		t.Run(tt.cidr.String(), func(t *testing.T) {
			a := f(t, tt.cidr)
			want := tt.cidr
			if c.multiCIDR {
				want = netip.Prefix{}
			}
			if got := a.CIDR(); got != want {
				t.Errorf("CIDR() = %v, want %v", got, want)
			}
			if got := a.Family(); got != tt.family {
				t.Errorf("Family() = %v, want %v", got, tt.family)
			}
			CheckCounts(t, a, 0, ipmath.Size(tt.cidr))
			if n := len(slices.Collect(a.All())); n != 0 {
				t.Errorf("All() of a new allocator yields %d addresses, want 0", n)
			}
		})
	}
}

func testExhaust(t *testing.T, f Factory, _ config) {
	for _, cidr := range []netip.Prefix{v4Small, v4Band, v6Small} {
		t.Run(cidr.String(), func(t *testing.T) {
			a := f(t, cidr)
			got := fill(t, a, cidr)
			if size := ipmath.Size(cidr); uint64(len(got)) != size {
				t.Fatalf("AllocateNext() gave %d addresses before ErrFull, want %d", len(got), size)
			}
			ip, err := a.AllocateNext(context.Background(), owner)
			if !errors.Is(err, allocator.ErrFull) || ip.IsValid() {
				t.Errorf("AllocateNext() on a full range = %v, %v; want the zero Addr and ErrFull", ip, err)
			}
			CheckCounts(t, a, ipmath.Size(cidr), 0)
		})
	}
}

func testReleaseAndReuse(t *testing.T, f Factory, _ config) {
	ctx := context.Background()
	a := f(t, v4Small)
	got := fill(t, a, v4Small)
	victim := got[len(got)/2]
	if err := a.Release(ctx, victim); err != nil {
		t.Fatalf("Release(%v) = %v", victim, err)
	}
	if a.Has(victim) {
		t.Errorf("Has(%v) = true after Release", victim)
	}
	if err := a.Release(ctx, victim); err != nil {
		t.Errorf("second Release(%v) = %v, want nil (idempotent)", victim, err)
	}
	CheckCounts(t, a, ipmath.Size(v4Small)-1, 1)
	ip, err := a.AllocateNext(ctx, owner)
	if err != nil || ip != victim {
		t.Fatalf("AllocateNext() after releasing %v = %v, %v; want %v, nil", victim, ip, err, victim)
	}
	for _, ip := range []netip.Addr{netip.MustParseAddr("203.0.113.9"), netip.MustParseAddr("2001:db8::1"), ipmath.Network(v4Small)} {
		if err := a.Release(ctx, ip); err != nil {
			t.Errorf("Release(%v) outside the range = %v, want nil", ip, err)
		}
	}
	CheckCounts(t, a, ipmath.Size(v4Small), 0)
}

func testAllocateSpecific(t *testing.T, f Factory, _ config) {
	ctx := context.Background()
	a := f(t, v4Band)
	for _, off := range []uint64{0, 15, 16, 29} { // both ends of both bands
		ip := addr(v4Band, off)
		if err := a.Allocate(ctx, ip, owner); err != nil {
			t.Fatalf("Allocate(%v) = %v", ip, err)
		}
		if !a.Has(ip) {
			t.Errorf("Has(%v) = false after Allocate", ip)
		}
		if err := a.Allocate(ctx, ip, owner); !errors.Is(err, allocator.ErrAllocated) {
			t.Errorf("second Allocate(%v) = %v, want ErrAllocated", ip, err)
		}
	}
	CheckCounts(t, a, 4, ipmath.Size(v4Band)-4)
}

func testNotInRange(t *testing.T, f Factory, c config) {
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		cidr netip.Prefix
		ip   netip.Addr
	}{
		{"IPv4 network address", v4Small, ipmath.Network(v4Small)},
		{"IPv4 broadcast address", v4Small, ipmath.Last(v4Small)},
		{"IPv4 outside", v4Small, netip.MustParseAddr("192.168.77.16")},
		{"IPv4 far outside", v4Small, netip.MustParseAddr("203.0.113.1")},
		{"IPv6 into IPv4", v4Small, netip.MustParseAddr("fd00:77::1")},
		{"IPv6 network address", v6Small, ipmath.Network(v6Small)},
		{"IPv6 outside", v6Small, netip.MustParseAddr("fd00:77::10")},
		{"IPv4 into IPv6", v6Small, netip.MustParseAddr("192.168.77.1")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := f(t, tt.cidr)
			err := a.Allocate(ctx, tt.ip, owner)
			var nir *allocator.NotInRangeError
			if !errors.As(err, &nir) {
				t.Fatalf("Allocate(%v) = %v, want a *NotInRangeError", tt.ip, err)
			}
			if nir.IP != tt.ip {
				t.Errorf("NotInRangeError.IP = %v, want %v", nir.IP, tt.ip)
			}
			if c.multiCIDR && !errors.Is(err, allocator.ErrMismatchedNetwork) {
				t.Errorf("Allocate(%v) = %v, want it to match ErrMismatchedNetwork", tt.ip, err)
			}
			if a.Has(tt.ip) {
				t.Errorf("Has(%v) = true", tt.ip)
			}
			CheckCounts(t, a, 0, ipmath.Size(tt.cidr))
		})
	}
}

func testBadInput(t *testing.T, f Factory, _ config) {
	ctx := context.Background()
	a := f(t, v6Small)
	bad := []netip.Addr{
		{},
		netip.MustParseAddr("fd00:77::1%eth0"),
		netip.MustParseAddr("::ffff:192.168.77.1"),
	}
	for _, ip := range bad {
		var ae *allocator.AddrError
		if err := a.Allocate(ctx, ip, owner); !errors.As(err, &ae) || !errors.Is(err, allocator.ErrInvalid) {
			t.Errorf("Allocate(%#v) = %v, want an *AddrError", ip, err)
		}
		if err := a.Release(ctx, ip); !errors.As(err, &ae) {
			t.Errorf("Release(%#v) = %v, want an *AddrError", ip, err)
		}
		if a.Has(ip) {
			t.Errorf("Has(%#v) = true", ip)
		}
	}
	CheckCounts(t, a, 0, ipmath.Size(v6Small))
}

func testBandOrder(t *testing.T, f Factory, _ config) {
	for _, cidr := range []netip.Prefix{v4Band, v6Band} {
		t.Run(cidr.String(), func(t *testing.T) {
			band := ipmath.BandOffset(cidr)
			size := ipmath.Size(cidr)
			if band == 0 {
				t.Fatalf("test range %v has no static band", cidr)
			}
			a := f(t, cidr)
			ctx := context.Background()
			for i := range size {
				ip, err := a.AllocateNext(ctx, owner)
				if err != nil {
					t.Fatalf("AllocateNext() #%d = %v", i, err)
				}
				off, _ := ipmath.Offset(cidr, ip)
				if upper := i < size-band; upper != (off >= band) {
					t.Fatalf("AllocateNext() #%d = %v (offset %d); want the upper band [%d,%d) first, then the static band", i, ip, off, band, size)
				}
			}
			if _, err := a.AllocateNext(ctx, owner); !errors.Is(err, allocator.ErrFull) {
				t.Errorf("AllocateNext() on a full range = %v, want ErrFull", err)
			}
		})
	}
}

func testAccounting(t *testing.T, f Factory, _ config) {
	ctx := context.Background()
	a := f(t, v4Wide)
	size := ipmath.Size(v4Wide)
	var held []netip.Addr
	for i := range 10 {
		ip, err := a.AllocateNext(ctx, owner)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, ip)
		CheckCounts(t, a, uint64(i+1), size-uint64(i+1))
	}
	static := addr(v4Wide, 3)
	if err := a.Allocate(ctx, static, owner); err != nil {
		t.Fatal(err)
	}
	CheckCounts(t, a, 11, size-11)
	_ = a.Allocate(ctx, static, owner)                     // ErrAllocated: no change
	_ = a.Allocate(ctx, ipmath.Network(v4Wide), owner)     // not in range: no change
	_ = a.Release(ctx, netip.MustParseAddr("203.0.113.1")) // outside: no change
	CheckCounts(t, a, 11, size-11)
	for i, ip := range held {
		if err := a.Release(ctx, ip); err != nil {
			t.Fatal(err)
		}
		CheckCounts(t, a, uint64(10-i), size-uint64(10-i))
	}
}

func testAll(t *testing.T, f Factory, _ config) {
	ctx := context.Background()
	a := f(t, v6Band)
	want := map[netip.Addr]bool{}
	for range 20 {
		ip, err := a.AllocateNext(ctx, owner)
		if err != nil {
			t.Fatal(err)
		}
		want[ip] = true
	}
	for _, off := range []uint64{0, 1, 15} { // static band: the 20 AllocateNext calls above stay in the upper one
		ip := addr(v6Band, off)
		if err := a.Allocate(ctx, ip, owner); err != nil {
			t.Fatal(err)
		}
		want[ip] = true
	}
	n := 0
	for ip := range want {
		if n%3 == 0 {
			if err := a.Release(ctx, ip); err != nil {
				t.Fatal(err)
			}
			delete(want, ip)
		}
		n++
	}
	got := slices.Collect(a.All())
	if !slices.IsSortedFunc(got, netip.Addr.Compare) {
		t.Errorf("All() = %v, not in ascending order", got)
	}
	wantList := make([]netip.Addr, 0, len(want))
	for ip := range want {
		wantList = append(wantList, ip)
	}
	slices.SortFunc(wantList, netip.Addr.Compare)
	if !slices.Equal(got, wantList) {
		t.Errorf("All() = %v, want %v", got, wantList)
	}
}

func testDryRun(t *testing.T, f Factory, _ config) {
	ctx := context.Background()
	a := f(t, v4Small)
	held, err := a.AllocateNext(ctx, owner)
	if err != nil {
		t.Fatal(err)
	}
	d := a.DryRun()
	free := addr(v4Small, 0)
	if free == held {
		free = addr(v4Small, 1)
	}
	if err := d.Allocate(ctx, free, owner); err != nil {
		t.Errorf("DryRun().Allocate(%v) = %v, want nil", free, err)
	}
	if err := d.Allocate(ctx, held, owner); !errors.Is(err, allocator.ErrAllocated) {
		t.Errorf("DryRun().Allocate(%v) of an allocated address = %v, want ErrAllocated", held, err)
	}
	var nir *allocator.NotInRangeError
	if err := d.Allocate(ctx, ipmath.Network(v4Small), owner); !errors.As(err, &nir) {
		t.Errorf("DryRun().Allocate(network) = %v, want a *NotInRangeError", err)
	}
	ip, err := d.AllocateNext(ctx, owner)
	if err != nil {
		t.Fatalf("DryRun().AllocateNext() = %v", err)
	}
	checkUsable(t, v4Small, ip)
	if ip == held {
		t.Errorf("DryRun().AllocateNext() = %v, which is allocated", ip)
	}
	if err := d.Release(ctx, held); err != nil {
		t.Errorf("DryRun().Release(%v) = %v", held, err)
	}
	if !a.Has(held) || a.Has(free) || a.Has(ip) {
		t.Errorf("after dry runs Has(held %v, free %v, next %v) = %v, %v, %v; want true, false, false",
			held, free, ip, a.Has(held), a.Has(free), a.Has(ip))
	}
	CheckCounts(t, a, 1, ipmath.Size(v4Small)-1)
}

func testConcurrentNext(t *testing.T, f Factory, c config) {
	a := f(t, v4Wide)
	ctx := context.Background()
	var (
		mu   sync.Mutex
		got  = map[netip.Addr]int{}
		errs []error
		wg   sync.WaitGroup
	)
	for w := range c.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ip, err := a.AllocateNext(ctx, allocator.Owner{Resource: "services", Namespace: "default", Name: "w" + string(rune('a'+w%26))})
				if errors.Is(err, allocator.ErrFull) {
					return
				}
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				got[ip]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		t.Errorf("AllocateNext() = %v", err)
	}
	for ip, n := range got {
		if n > 1 {
			t.Errorf("AllocateNext() returned %v %d times", ip, n)
		}
		checkUsable(t, v4Wide, ip)
	}
	if size := ipmath.Size(v4Wide); uint64(len(got)) != size {
		t.Errorf("%d workers got %d distinct addresses before ErrFull, want %d", c.workers, len(got), size)
	}
	CheckCounts(t, a, uint64(len(got)), ipmath.Size(v4Wide)-uint64(len(got)))
}

func testConcurrentSame(t *testing.T, f Factory, c config) {
	a := f(t, v4Small)
	ip := addr(v4Small, 5)
	ExactlyOneWinner(t, context.Background(), ip, owner, slices.Repeat([]allocator.Interface{a}, c.workers)...)
	CheckCounts(t, a, 1, ipmath.Size(v4Small)-1)
}

func testSmallest(t *testing.T, f Factory, _ config) {
	for _, tt := range []struct {
		cidr netip.Prefix
		want []netip.Addr
	}{
		{v4One, []netip.Addr{netip.MustParseAddr("192.168.80.1"), netip.MustParseAddr("192.168.80.2")}},
		{v6One, []netip.Addr{netip.MustParseAddr("fd00:80::1")}},
	} {
		t.Run(tt.cidr.String(), func(t *testing.T) {
			a := f(t, tt.cidr)
			got := fill(t, a, tt.cidr)
			slices.SortFunc(got, netip.Addr.Compare)
			if !slices.Equal(got, tt.want) {
				t.Errorf("AllocateNext() until full = %v, want %v", got, tt.want)
			}
		})
	}
}

func testInvalidOwner(t *testing.T, f Factory, c config) {
	if !c.recordsOwners {
		t.Skip("the allocator records no owners (pass allocatortest.RecordsOwners() if it does)")
	}
	ctx := context.Background()
	a := f(t, v4Small)
	ip := addr(v4Small, 3)
	d := a.DryRun()
	for _, o := range []allocator.Owner{
		{},
		{Namespace: "default", Name: "conformance"},
		{Resource: "services", Namespace: "default"},
	} {
		calls := []struct {
			name string
			call func() error
		}{
			{"Allocate", func() error { return a.Allocate(ctx, ip, o) }},
			{"AllocateNext", func() error { _, err := a.AllocateNext(ctx, o); return err }},
			{"DryRun().Allocate", func() error { return d.Allocate(ctx, ip, o) }},
			{"DryRun().AllocateNext", func() error { _, err := d.AllocateNext(ctx, o); return err }},
		}
		for _, call := range calls {
			err := call.call()
			var oe *allocator.OwnerError
			if !errors.As(err, &oe) || !errors.Is(err, allocator.ErrInvalid) {
				t.Errorf("%s(owner %#v) = %v, want an *allocator.OwnerError matching ErrInvalid", call.name, o, err)
			}
		}
	}
	if a.Has(ip) {
		t.Errorf("Has(%v) = true after Allocate with invalid owners", ip)
	}
	CheckCounts(t, a, 0, ipmath.Size(v4Small))
	if err := a.Allocate(ctx, ip, owner); err != nil {
		t.Errorf("Allocate(%v) with a valid owner after invalid ones = %v", ip, err)
	}
}
