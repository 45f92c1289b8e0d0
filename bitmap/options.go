package bitmap

import (
	"fmt"
	"math/rand/v2"

	"github.com/kube-ipam/clusterip/allocator"
)

// Option configures an Allocator or a Persistent allocator.
type Option func(*options)

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
			return options{}, fmt.Errorf("%w: bitmap: option %d is nil", allocator.ErrInvalid, i)
		}
		opt(&o)
	}
	if o.rand == nil {
		o.rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	return o, nil
}

// WithSeed makes the random start of AllocateNext deterministic, for tests and reproducible demos.
// By default each allocator is seeded randomly.
func WithSeed(seed uint64) Option {
	return func(o *options) { o.rand = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }
}
