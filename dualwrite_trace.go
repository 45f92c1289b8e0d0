package clusterip

import (
	"context"
	"net/netip"
)

// DualWriteTrace holds hooks that report what a call of a DualWriteAllocator does to the bitmap
// besides what it answers, for tools that record what each call wrote (a history checked for
// linearizability, a debugger), as net/http/httptrace reports a request's connection events.
// Attach one to a call's context with WithDualWriteTrace. A nil hook is not called.
type DualWriteTrace struct {
	// BitGivenBack is called with each address whose bit the call set, finding it clear, and
	// cleared again before it returned: an AllocateNext gives back the bit of an address whose
	// IPAddress object it then finds there (or that no ready ServiceCIDR serves), and an Allocate
	// the bit of an address whose create is refused. Meanwhile, callers that read the bitmap
	// (Legacy peers, kube-apiserver in dual write) were refused that address. It is called from
	// the call's goroutine, before the call returns.
	BitGivenBack func(ip netip.Addr)
	// BitKept is called with each address whose bit the call set, finding it clear, and left
	// set although the address is not the call's allocation: its IPAddress create had an
	// ambiguous answer and the object was then found with another owner, or not found (it may
	// yet be stored). The bit stays for repair; until then callers that read the bitmap are
	// refused the address. An AllocateNext goes on to another address after one. It is called
	// from the call's goroutine, before the call returns.
	BitKept func(ip netip.Addr)
}

// dualWriteTraceKey is the context key of a *DualWriteTrace.
type dualWriteTraceKey struct{}

// WithDualWriteTrace returns a copy of ctx that carries t: the calls of a DualWriteAllocator
// made with it report to t's hooks.
func WithDualWriteTrace(ctx context.Context, t *DualWriteTrace) context.Context {
	return context.WithValue(ctx, dualWriteTraceKey{}, t)
}

// bitGivenBack reports ip to the BitGivenBack hook of ctx's trace, if any.
func bitGivenBack(ctx context.Context, ip netip.Addr) {
	if t, ok := ctx.Value(dualWriteTraceKey{}).(*DualWriteTrace); ok && t != nil && t.BitGivenBack != nil {
		t.BitGivenBack(ip)
	}
}

// bitKept reports ip to the BitKept hook of ctx's trace, if any.
func bitKept(ctx context.Context, ip netip.Addr) {
	if t, ok := ctx.Value(dualWriteTraceKey{}).(*DualWriteTrace); ok && t != nil && t.BitKept != nil {
		t.BitKept(ip)
	}
}
