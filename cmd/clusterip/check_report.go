package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"sigs.k8s.io/yaml"

	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/repair"
)

// print writes rep to stdout as -o asks: json and yaml exactly as repair.Report marshals, table
// as repair.Report.WriteTable writes it followed by note (if any) and the repair plan. With json
// and yaml, note goes to stderr so that stdout holds the report alone.
func (o *checkOptions) print(stdout, stderr io.Writer, rep *repair.Report, mode featuregate.Mode, note string) error {
	switch o.output {
	case "json", "yaml":
		if note != "" {
			fmt.Fprintf(stderr, "clusterip: note: %s\n", note)
		}
		return writeJSONOrYAML(stdout, rep, o.output)
	}
	if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	if note != "" {
		fmt.Fprintf(stdout, "Note: %s.\n", note)
	}
	return o.writePlan(stdout, rep, mode)
}

// writePlan writes what repair does (or, after a repair, would still do) about each finding.
func (o *checkOptions) writePlan(w io.Writer, rep *repair.Report, mode featuregate.Mode) error {
	if len(rep.Findings) == 0 {
		return nil
	}
	hold := fmt.Sprintf("the hold-off is --leak-grace %v", o.leakGrace)
	if o.leakGrace == 0 {
		hold = "no hold-off (--leak-grace 0)"
	}
	fmt.Fprintf(w, "\nRepair plan (what clusterip repair does, in %s mode; %s):\n", mode, hold)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IP\tCLASS\tACTION")
	for _, f := range rep.Findings {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", f.IP, f.Class, f.Class.Plan(mode))
	}
	return tw.Flush()
}

// writeJSONOrYAML writes v to w as indented JSON, or as YAML when format is "yaml", as kubectl's
// -o json and -o yaml do.
func writeJSONOrYAML(w io.Writer, v any, format string) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if format == "yaml" {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return err
		}
	} else {
		b = append(b, '\n')
	}
	_, err = w.Write(b)
	return err
}
