package demo

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// writeTable writes the summary as a table: one row per phase, kube-apiserver played and IP
// family, then the audits and the duplicate check.
func writeTable(w io.Writer, s *Summary) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PHASE\tALLOCATOR\tMODE\tFAMILY\tALLOCATED\tRELEASED\tCONFLICTS\tUNDOS\tREFUSED\tERRORS\tP50\tP99")
	for i, p := range s.Phases {
		for _, a := range p.Allocators {
			fmt.Fprintf(tw, "%d %s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", i+1, p.Name, a.Allocator, a.Mode, a.Family,
				a.Allocations, a.Releases, a.Conflicts, a.Undos, a.Refused, a.Errors, ms(a.P50Ms), ms(a.P99Ms))
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	for i, p := range s.Phases {
		if p.Repair != nil {
			fmt.Fprintf(w, "repair pass before phase %d: %s\n", i+1, describeRepair(*p.Repair))
		}
		fmt.Fprintf(w, "after phase %d %s: %d Services, %s\n", i+1, p.Name, p.Services, describeAudit(p.Audit))
	}
	for _, p := range s.Phases {
		for _, a := range p.Allocators {
			if a.FirstError != "" {
				fmt.Fprintf(w, "%s %s %s: first of %d errors: %s\n", p.Name, a.Allocator, a.Family, a.Errors, a.FirstError)
			}
		}
	}
	fmt.Fprintf(w, "duplicates: %d (every address handed out checked against those held, and the Services stored after each phase)\n", s.Duplicates)
	fmt.Fprintf(w, "done in %v\n", time.Duration(s.Seconds*float64(time.Second)).Round(100*time.Millisecond))
}

// ms formats milliseconds for the table.
func ms(v float64) string {
	d := time.Duration(v * float64(time.Millisecond))
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	}
	return d.Round(time.Microsecond).String()
}
