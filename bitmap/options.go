package bitmap

import "math/rand/v2"

// Option configures an Allocator or a Persistent allocator.
type Option func(*options)

type options struct {
	rand    *rand.Rand
	persist persistentOptions // settings of Persistent only; see persistent_options.go
}

func buildOptions(opts []Option) options {
	var o options
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.rand == nil {
		o.rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	return o
}

// WithSeed makes the random start of AllocateNext deterministic, for tests and reproducible demos.
// By default each allocator is seeded randomly.
func WithSeed(seed uint64) Option {
	return func(o *options) { o.rand = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }
}
