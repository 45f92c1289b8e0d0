package ipaddress

import (
	"math/rand/v2"
	"time"

	"k8s.io/klog/v2"
)

// DefaultManagedBy is the value of the ipaddress.kubernetes.io/managed-by label that kube-apiserver
// itself puts on the IPAddress objects of Service ClusterIPs.
const DefaultManagedBy = "ipallocator.k8s.io"

// DefaultAssumeTimeout is how long an Allocator trusts its own write over an informer that has not
// shown it yet; see WithAssumeTimeout.
const DefaultAssumeTimeout = time.Minute

// Option configures New.
type Option func(*options)

type options struct {
	managedBy     string
	rand          *rand.Rand
	assumeTimeout time.Duration
	serverDryRun  bool
	ready         bool
	logger        *klog.Logger
	now           func() time.Time // tests only
}

func buildOptions(opts []Option) options {
	o := options{
		managedBy:     DefaultManagedBy,
		assumeTimeout: DefaultAssumeTimeout,
		ready:         true,
		now:           time.Now,
	}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.rand == nil {
		o.rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	if o.logger == nil {
		l := klog.Background()
		o.logger = &l
	}
	return o
}

// WithManagedBy sets the ipaddress.kubernetes.io/managed-by label of the IPAddress objects the
// Allocator creates. Default DefaultManagedBy ("ipallocator.k8s.io"); an empty value keeps the
// default. The label is informational: the Allocator counts every IPAddress in its range as
// allocated, whoever manages it.
func WithManagedBy(value string) Option {
	return func(o *options) {
		if value != "" {
			o.managedBy = value
		}
	}
}

// WithSeed makes the random start of AllocateNext deterministic, for tests and reproducible demos.
// By default each Allocator is seeded randomly.
func WithSeed(seed uint64) Option {
	return func(o *options) { o.rand = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }
}

// WithAssumeTimeout sets how long the Allocator trusts one of its own successful writes (an
// IPAddress it created counts as allocated, one it deleted as free) while the informer has not
// shown the write or anything newer. After that it falls back to the informer's cache, which
// covers a write the informer never reports (an object created and deleted again between two
// lists). An assumed delete that the informer contradicts with an object the Allocator cannot
// order against it (no usable UID or resourceVersion) is held for at most a second instead.
// Default DefaultAssumeTimeout (1 minute); d ≤ 0 keeps the default.
func WithAssumeTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.assumeTimeout = d
		}
	}
}

// WithServerDryRun makes DryRun().Allocate also send a server-side dry-run Create (DryRun: All), so
// that the API server's validation and admission run without persisting anything. Default off:
// the dry run answers from the local index only. Leave it off with the client-go fake clientset,
// which ignores DryRun and would persist the object.
func WithServerDryRun(on bool) Option {
	return func(o *options) { o.serverDryRun = on }
}

// WithReady sets the initial value of the readiness switch of SetReady. Default true, so that an
// Allocator serves as soon as its informer has synced; package servicecidr starts it false until
// its ServiceCIDR is ready.
func WithReady(ready bool) Option {
	return func(o *options) { o.ready = ready }
}

// WithLogger sets the logger for informer events, which carry no context. Calls that take a
// context log to klog.FromContext(ctx). Default klog.Background().
func WithLogger(logger klog.Logger) Option {
	return func(o *options) { o.logger = &logger }
}
