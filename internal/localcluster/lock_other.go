//go:build !unix

package localcluster

import "context"

// lockFile does nothing where flock is missing: concurrent builds then race,
// and the last rename wins.
func lockFile(ctx context.Context, path string, onWait func()) (unlock func(), err error) {
	return func() {}, nil
}
