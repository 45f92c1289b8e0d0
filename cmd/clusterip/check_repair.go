package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	// Named cip: the tests of this package have a helper named clusterip.
	cip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/repair"
)

// maxFailedPasses is how many repair passes in a row may fail (a compare-and-swap that lost to a
// concurrent allocation, say) before --repair gives up.
const maxFailedPasses = 3

// repairUntilDone runs repair passes on the cluster cfg describes until one leaves no leak held
// off, waiting between passes for the hold-off to run out, with a progress line on stderr per
// pass. It returns the error of the last pass if maxFailedPasses fail in a row, ctx's if it is
// cancelled, and an error naming --repair-timeout if ctx's deadline (which run sets from it)
// passes first.
func (o *checkOptions) repairUntilDone(ctx context.Context, cfg cip.Config, stderr io.Writer) error {
	c, err := repair.NewController(cfg, repair.Options{LeakGrace: leakGraceOption(o.leakGrace)})
	if err != nil {
		return err
	}
	wait := passInterval(o.leakGrace)
	failed := 0
	timedOut := func(pass int) error {
		return fmt.Errorf("--repair did not finish within --repair-timeout %v: %d passes, %s held off by --leak-grace %v after the last complete one",
			o.repairTimeout, pass, count(c.HeldOff(), "leak"), o.leakGrace)
	}
	for pass := 1; ; pass++ {
		rep, err := c.RunOnce(ctx)
		switch {
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			return timedOut(pass)
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			failed++
			if failed == maxFailedPasses {
				return fmt.Errorf("repair: %d passes failed in a row, the last: %w", failed, err)
			}
			fmt.Fprintf(stderr, "clusterip: repair pass %d failed, trying again in %v: %s\n", pass, wait, oneLine(err.Error()))
		case c.HeldOff() == 0:
			fmt.Fprintf(stderr, "clusterip: repair pass %d: %s, none held off; auditing again\n", pass, count(len(rep.Findings), "finding"))
			return nil
		default:
			failed = 0
			fmt.Fprintf(stderr, "clusterip: repair pass %d: %s, %s held off (--leak-grace %v); next pass in %v\n",
				pass, count(len(rep.Findings), "finding"), count(c.HeldOff(), "leak"), o.leakGrace, wait)
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return timedOut(pass)
			}
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// leakGraceOption maps --leak-grace to repair.Options.LeakGrace, where 0 means the default and
// a negative value no hold-off.
func leakGraceOption(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// passInterval is how long --repair waits between passes while leaks are held off: a tenth of
// the hold-off, from 1 to 10 seconds (Legacy mode holds a leaked bit for 3 passes even with no
// hold-off).
func passInterval(leakGrace time.Duration) time.Duration {
	return min(max(leakGrace/10, time.Second), 10*time.Second)
}

// count returns "1 thing" or "n things".
func count(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
