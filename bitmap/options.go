package bitmap

import (
	"fmt"
	"math/rand/v2"

	"github.com/kube-ipam/clusterip/allocator"
)

// PersistentOption configures a Persistent allocator. Every Option is one; WithMaxAttempts,
// WithBackoff, WithMaxBatch and WithoutBatching are PersistentOptions only, so passing one of
// them to New does not compile.
type PersistentOption interface {
	applyPersistent(*options)
}

// Option configures an Allocator, and a Persistent allocator too.
type Option interface {
	PersistentOption
	apply(*options)
}

// optionFunc is an Option.
type optionFunc func(*options)

func (f optionFunc) apply(o *options) {
	if f != nil {
		f(o)
	}
}

func (f optionFunc) applyPersistent(o *options) { f.apply(o) }

// persistentOptionFunc is a PersistentOption that is not an Option.
type persistentOptionFunc func(*persistentOptions)

func (f persistentOptionFunc) applyPersistent(o *options) {
	if f != nil {
		f(&o.persist)
	}
}

type options struct {
	rand    *rand.Rand
	persist persistentOptions // settings of Persistent only; see persistent_options.go
}

// buildOptions applies opts to the defaults. A nil Option is an error matching
// allocator.ErrInvalid.
func buildOptions(opts []Option) (options, error) {
	var o options
	for i, opt := range opts {
		if opt == nil {
			return options{}, nilOption(i)
		}
		opt.apply(&o)
	}
	return o.withDefaults(), nil
}

// buildPersistentOptions is buildOptions for NewPersistent.
func buildPersistentOptions(opts []PersistentOption) (options, error) {
	var o options
	for i, opt := range opts {
		if opt == nil {
			return options{}, nilOption(i)
		}
		opt.applyPersistent(&o)
	}
	o.persist = o.persist.withDefaults()
	return o.withDefaults(), nil
}

func nilOption(i int) error {
	return fmt.Errorf("%w: bitmap: option %d is nil", allocator.ErrInvalid, i)
}

func (o options) withDefaults() options {
	if o.rand == nil {
		o.rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	return o
}

// WithSeed makes the random start of AllocateNext deterministic, for tests and reproducible demos.
// By default each allocator is seeded randomly.
func WithSeed(seed uint64) Option {
	return optionFunc(func(o *options) { o.rand = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) })
}
