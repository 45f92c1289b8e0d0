package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	// Named cip: the tests of this package have a helper named clusterip.
	cip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/repair"
)

const repairLong = `Repair what "clusterip check" finds in a live cluster's Service IP allocation, then audit again.
repair takes check's flags (kube-apiserver's etcd flags among them), and --dry-run.

repair runs passes of the clusterip library's repair controller, which writes only with
compare-and-swap (the bitmaps in etcd) and preconditioned deletes (IPAddress objects), passing
again (a progress line on stderr) until no leak is held off by --leak-grace; then it audits again,
and that audit is printed, as check prints it, and decides the exit code. Invalid, duplicate and
out-of-range ClusterIPs are not changed: the repair plan says so. --repair-timeout (10m) bounds
the passes and their waits; keep it longer than --leak-grace.

--dry-run changes nothing: repair audits as check does and prints the report with the repair plan,
what repair would do about each finding, and needs only check's read permissions.

--leak-grace 0 frees a leak as soon as a pass sees it. An allocation in flight looks like a leak
for a moment: kube-apiserver and this library write the IPAddress object (and the bit) before
the Service, so between the two an IPAddress is held by no Service. With no hold-off repair may
delete that record while its Service is being created, and the Service then holds an address
that another Service can be given. Use 0 only on a cluster where nothing allocates meanwhile
(kube-apiserver's own repair waits 60s); the default 1m covers an allocation in flight.

--remove-stale-bitmaps also removes the bitmaps a Legacy or DualWrite era left in etcd
(<--etcd-prefix>/ranges/serviceips and .../secondaryserviceips), which check lists as stale in
IPAddressOnly mode; it needs --etcd-servers and an IPAddressOnly audit, and is off by default. A
kube-apiserver below 1.38 that emulates a version below 1.35 can still run Legacy or DualWrite
and write them (a 1.38 or later one never can, whatever it emulates), so before it changes anything repair counts the live kube-apiservers by their identity
Leases in kube-system and reads each one's /version with the kubeconfig's credentials: at the
peer address every Lease advertises (kube-apiserver writes one with its
UnknownVersionInteroperabilityProxy gate, on by default from 1.36), or, if a Lease has none, at
the URLs of --apiserver-endpoints, which must be as many as the live Leases. Naming them, you
vouch that the list is complete and that each URL reaches one server, not a load balancer. If a
server emulates below 1.35, or one is not accounted for, repair changes nothing and exits 2 saying
which and why; a stopped server's Lease stays live for an hour. Otherwise, after its passes,
it checks the servers again and deletes each stale bitmap with a compare-and-delete at the
revision an audit has just read, so one written since stays (exit 2), and names on stderr each
it removed. With --dry-run it
says on stderr which it would remove and why it may, or exits 2 with why it may not.

Permissions: repair reads what check reads, and creates, updates and deletes IPAddress objects:
the ClusterRoles clusterip-check and clusterip-check-repair in deploy/rbac of the clusterip
repository grant exactly that. It names any permission it lacks before it changes anything.
--remove-stale-bitmaps also lists leases.coordination.k8s.io in kube-system: the Role
clusterip-remove-stale-bitmaps there grants it.

Exit codes: 0 consistent after the repair (with --dry-run: nothing to repair); 1 inconsistencies
remain (with --dry-run: there is something to repair, listed in the plan, or with
--remove-stale-bitmaps a stale bitmap to remove); 2 could not run (as check, past
--repair-timeout, or a stale bitmap that may not be removed), with one line on stderr saying why.`

const repairExample = `  # See what repair would change, changing nothing
  clusterip repair --dry-run --etcd-servers https://10.0.0.2:2379 \
      --etcd-cafile ca.crt --etcd-certfile client.crt --etcd-keyfile client.key

  # Repair, freeing leaks held for 5 minutes or more, then audit again
  clusterip repair --leak-grace 5m --etcd-servers https://10.0.0.2:2379 \
      --etcd-cafile ca.crt --etcd-certfile client.crt --etcd-keyfile client.key

  # Repair and remove the stale bitmaps of an IPAddressOnly cluster of three kube-apiservers
  # whose identity Leases advertise no peer address
  clusterip repair --remove-stale-bitmaps --etcd-servers https://10.0.0.2:2379 \
      --etcd-cafile ca.crt --etcd-certfile client.crt --etcd-keyfile client.key \
      --apiserver-endpoints https://10.0.0.2:6443,https://10.0.0.3:6443,https://10.0.0.4:6443`

func newRepairCommand() *cobra.Command {
	o := newCheckOptions()
	o.repair = true
	cmd := &cobra.Command{
		Use:     "repair",
		Short:   "Repair a live cluster's Service IP allocation, then audit again (--dry-run: change nothing)",
		Long:    repairLong,
		Example: repairExample,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	o.addFlags(cmd)
	f := cmd.Flags()
	f.BoolVar(&o.dryRun, "dry-run", false, "audit and print what repair would change, and change nothing")
	f.BoolVar(&o.removeStaleBitmaps, "remove-stale-bitmaps", false, "in IPAddressOnly mode, with --etcd-servers, also remove the bitmaps a Legacy or DualWrite era left in etcd, once no live kube-apiserver can write them (see above)")
	f.StringSliceVar(&o.apiserverEndpoints, "apiserver-endpoints", nil, "with --remove-stale-bitmaps, the URL of every kube-apiserver (comma-separated, one per server, not a load balancer), for identity Leases without peer addresses")
	return cmd
}

// dryRunSummary says what a dry run's audit rep leaves for repair: its findings, and with
// --remove-stale-bitmaps its stale bitmaps.
func (o *checkOptions) dryRunSummary(rep *repair.Report) string {
	stale := 0
	if o.removeStaleBitmaps {
		stale = len(rep.StaleBitmaps)
	}
	switch {
	case len(rep.Findings) == 0 && stale == 0:
		return "there is nothing to repair"
	case stale == 0:
		return fmt.Sprintf("without --dry-run, repair would act on %s, as the repair plan of -o table says", count(len(rep.Findings), "finding"))
	case len(rep.Findings) == 0:
		return fmt.Sprintf("without --dry-run, repair would remove %s, if no kube-apiserver can write them", count(stale, "stale bitmap"))
	}
	return fmt.Sprintf("without --dry-run, repair would act on %s, as the repair plan of -o table says, and remove %s, if no kube-apiserver can write them",
		count(len(rep.Findings), "finding"), count(stale, "stale bitmap"))
}

// maxFailedPasses is how many repair passes in a row may fail (a compare-and-swap that lost to a
// concurrent allocation, say) before repair gives up.
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
		return fmt.Errorf("repair did not finish within --repair-timeout %v: %d passes, %s held off by --leak-grace %v after the last complete one",
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

// passInterval is how long repair waits between passes while leaks are held off: a tenth of
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
