package repair

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/kube-ipam/clusterip/reservation"
)

// WriteTable writes r for a person: a summary line, the counts, then one row per finding (IP,
// class, Service, detail) in the report's order, and the sections that follow: stale bitmaps,
// reservations, the caps on reservations, and the upgrade pre-flight (Upgrade), when there are any. It returns the first write error.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	state := "consistent"
	if !r.Consistent {
		state = fmt.Sprintf("inconsistent: %d findings", len(r.Findings))
	}
	fmt.Fprintf(tw, "Mode %s: %s\n", r.Mode, state)
	fmt.Fprintf(tw, "Read %d Services, %d IPAddress objects, %d bitmap bits.\n",
		r.Counts[CountServices], r.Counts[CountIPAddresses], r.Counts[CountBitmapBits])
	if len(r.Findings) > 0 {
		var per []string
		for _, c := range classOrder {
			if n := r.Counts[string(c)]; n > 0 {
				per = append(per, fmt.Sprintf("%s %d", c, n))
			}
		}
		fmt.Fprintf(tw, "By class: %s.\n\n", strings.Join(per, ", "))
		fmt.Fprintln(tw, "IP\tCLASS\tSERVICE\tDETAIL")
		for _, f := range r.Findings {
			svc := f.Service
			if svc == "" {
				svc = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.IP, f.Class, svc, f.Detail)
		}
	}
	if len(r.StaleBitmaps) > 0 {
		fmt.Fprintf(tw, "\nStale bitmaps: IPAddressOnly mode neither reads nor writes them; a Legacy or DualWrite era left them.\n")
		fmt.Fprintln(tw, "RANGE\tKEY\tSTORED RANGE\tBITS\tREVISION")
		for _, b := range r.StaleBitmaps {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\n", b.Range, b.Key, b.StoredRange, b.Bits, b.Revision)
		}
	}
	if len(r.Reservations) > 0 {
		fmt.Fprintf(tw, "\nReservations to look at (not findings; repair changes nothing for them):\n")
		fmt.Fprintln(tw, "IP\tFOR\tNAME\tPROBLEM")
		for _, f := range r.Reservations {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.IP, orDash(f.For), orDash(f.Name), f.Problem)
		}
	}
	if c := r.Caps; c != nil {
		fmt.Fprintf(tw, "\nReservation caps (%s on Namespaces, %s on ServiceCIDRs):\n", reservation.AnnotationMaxRetained, reservation.AnnotationMaxReserved)
		if len(c.Namespaces) > 0 {
			fmt.Fprintln(tw, "NAMESPACE\tRESERVED\tMAX-RETAINED\tSTATE")
			for _, u := range c.Namespaces {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", u.Namespace, u.Reserved, u.Cap, u.State)
			}
		}
		if len(c.ServiceCIDRs) > 0 {
			if len(c.Namespaces) > 0 {
				fmt.Fprintln(tw)
			}
			fmt.Fprintln(tw, "SERVICECIDR\tPREFIX\tRESERVED\tMAX-RESERVED\tSTATE")
			for _, u := range c.ServiceCIDRs {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", u.ServiceCIDR, u.Prefix, u.Reserved, u.Cap, u.State)
			}
		}
		var over []string
		for _, u := range c.Namespaces {
			if u.State == CapOver {
				over = append(over, u.Namespace)
			}
		}
		if len(over) > 0 {
			fmt.Fprintf(tw, "Namespaces over their cap: %v (deletes in flight can overshoot it; no Retain Service of theirs is created, and no address kept, until they are back within it).\n", over)
		}
	}
	if u := r.Upgrade; u != nil {
		fmt.Fprintf(tw, "\nUpgrade to %s: %s: %s.\n", u.Target, u.Status, u.Detail)
		if u.Hazard != "" {
			fmt.Fprintf(tw, "HAZARD: %s.\n", u.Hazard)
		}
		if len(u.Servers) > 0 {
			fmt.Fprintln(tw, "SERVER\tVERSION\tEMULATED\tBITMAPS\tWHY")
			for _, s := range u.Servers {
				bitmaps := "never"
				switch {
				case s.Unknown:
					bitmaps = "unknown"
				case s.CanWriteBitmaps:
					bitmaps = "can write"
				}
				name := s.name()
				if !s.Counted {
					name += " (kubeconfig)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", name, orDash(s.GitVersion), orDash(s.Emulated), bitmaps, s.Reason)
			}
		}
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
