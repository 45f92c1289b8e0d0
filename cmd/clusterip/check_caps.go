package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/reservation"
)

// capRow is one line of the caps report: a Namespace, or a prefix of a ServiceCIDR, with how
// many reservations it keeps and its cap.
type capRow struct {
	name, prefix string
	kept         int
	limit        string // the cap as written, or what stands for it
	state        string // "ok", "at cap", "over", "may not retain", "invalid"
}

// capsReport is what check says of the caps on reservations (package reservation's Limits):
// each Namespace that has a max-retained annotation or keeps reservations, and each prefix of a
// ServiceCIDR that has a max-reserved annotation.
type capsReport struct {
	namespaces, cidrs []capRow
}

// readCaps lists the Namespaces, the ServiceCIDRs and the reservations and counts, as
// reservation.Limits does, the reservations that have not ended at now.
func readCaps(ctx context.Context, client kubernetes.Interface, now time.Time) (*capsReport, error) {
	rc, err := reservation.New(client)
	if err != nil {
		return nil, err
	}
	all, err := rc.List(ctx)
	if err != nil {
		return nil, err
	}
	live := slices.DeleteFunc(all, func(r reservation.Reservation) bool { return r.Expired(now) })
	nss, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Namespaces: %w", err)
	}
	cidrs, err := client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ServiceCIDRs: %w", err)
	}
	rep := &capsReport{}
	perNS := map[string]int{}
	for _, r := range live {
		if r.For.Name != "" {
			perNS[r.For.Namespace]++
		}
	}
	seen := map[string]bool{}
	for _, ns := range nss.Items {
		seen[ns.Name] = true
		value, ok := ns.Annotations[reservation.AnnotationMaxRetained]
		if !ok && perNS[ns.Name] == 0 {
			continue
		}
		rep.namespaces = append(rep.namespaces, nsRow(ns.Name, perNS[ns.Name], value, ok))
	}
	for ns, n := range perNS {
		if !seen[ns] {
			rep.namespaces = append(rep.namespaces, nsRow(ns, n, "", false))
		}
	}
	slices.SortFunc(rep.namespaces, func(a, b capRow) int { return strings.Compare(a.name, b.name) })
	for _, sc := range cidrs.Items {
		value, ok := sc.Annotations[reservation.AnnotationMaxReserved]
		if !ok {
			continue
		}
		m, perr := reservation.ParseMaxReserved(value)
		for _, s := range sc.Spec.CIDRs {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				continue
			}
			p = p.Masked()
			kept := 0
			for _, r := range live {
				if p.Contains(r.Addr) {
					kept++
				}
			}
			row := capRow{name: sc.Name, prefix: p.String(), kept: kept}
			if perr != nil {
				row.limit, row.state = strconv.Quote(value), "invalid (no cap)"
			} else {
				limit := m.Of(p)
				row.limit = strconv.Itoa(limit)
				if m.Percent {
					row.limit += " (" + m.String() + ")"
				}
				row.state = capState(kept, limit)
			}
			rep.cidrs = append(rep.cidrs, row)
		}
	}
	return rep, nil
}

// nsRow is the row of namespace ns keeping kept reservations, whose max-retained is value (ok:
// it has the annotation).
func nsRow(ns string, kept int, value string, ok bool) capRow {
	row := capRow{name: ns, kept: kept}
	n, err := reservation.ParseMaxRetained(value)
	switch {
	case !ok:
		row.limit, row.state = "none", "may not retain"
	case err != nil:
		row.limit, row.state = strconv.Quote(value), "invalid (may not retain)"
	case n == 0:
		row.limit, row.state = "0", "may not retain"
	default:
		row.limit, row.state = strconv.Itoa(n), capState(kept, n)
	}
	return row
}

// capState says where kept stands against limit.
func capState(kept, limit int) string {
	switch {
	case kept > limit:
		return "over"
	case kept == limit:
		return "at cap"
	}
	return "ok"
}

// write writes the report as two tables, or nothing when there is nothing to say.
func (r *capsReport) write(w io.Writer) error {
	if len(r.namespaces) == 0 && len(r.cidrs) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nReservation caps (%s on Namespaces, %s on ServiceCIDRs):\n", reservation.AnnotationMaxRetained, reservation.AnnotationMaxReserved)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(r.namespaces) > 0 {
		fmt.Fprintln(tw, "NAMESPACE\tRESERVED\tMAX-RETAINED\tSTATE")
		for _, row := range r.namespaces {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", row.name, row.kept, row.limit, row.state)
		}
	}
	if len(r.cidrs) > 0 {
		if len(r.namespaces) > 0 {
			fmt.Fprintln(tw)
		}
		fmt.Fprintln(tw, "SERVICECIDR\tPREFIX\tRESERVED\tMAX-RESERVED\tSTATE")
		for _, row := range r.cidrs {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", row.name, row.prefix, row.kept, row.limit, row.state)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var over []string
	for _, row := range r.namespaces {
		if row.state == "over" {
			over = append(over, row.name)
		}
	}
	if len(over) > 0 {
		fmt.Fprintf(w, "Namespaces over their cap: %v (deletes in flight can overshoot it; no Retain Service of theirs is created, and no address kept, until they are back within it).\n", over)
	}
	return nil
}

// printCaps writes the caps report after the table (to stderr with -o json or yaml, whose stdout
// is the audit's report alone) in a mode with IPAddress objects. It is best-effort: a user whose
// role cannot list Namespaces (clusterip-check grants it from this release) gets a note on stderr
// instead, and the check's outcome does not change.
func (o *checkOptions) printCaps(ctx context.Context, client kubernetes.Interface, stdout, stderr io.Writer, mode featuregate.Mode) {
	if mode == featuregate.Legacy {
		return
	}
	if o.output == "json" || o.output == "yaml" {
		stdout = stderr
	}
	rep, err := readCaps(ctx, client, time.Now())
	if err == nil {
		err = rep.write(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "clusterip: note: the caps on reservations were not read: %v\n", err)
	}
}
