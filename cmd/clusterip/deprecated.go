package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Spellings the command replaced keep working for one release, hidden from --help, with a
// warning on stderr naming the new spelling (the CHANGELOG's promise for the command). The
// warnings are written by the command itself: pflag's own deprecation notice goes to cobra's
// output, which is stdout here, and would spoil -o json.

// renamedTo is the annotation of an old flag spelling that names the flag replacing it.
const renamedTo = "clusterip/renamed-to"

// addOldSpelling registers old as a hidden spelling of cmd's flag named current, sharing its
// value, so that both set the same variable. current must be registered first.
func addOldSpelling(cmd *cobra.Command, old, current string) {
	f := cmd.Flags()
	f.Var(f.Lookup(current).Value, old, "deprecated: use --"+current)
	_ = f.MarkHidden(old)
	_ = f.SetAnnotation(old, renamedTo, []string{current})
}

// warnOldSpellings writes a deprecation warning to stderr for each old flag spelling given to
// cmd, and returns an error if a flag was given under both its old and its new spelling.
func warnOldSpellings(cmd *cobra.Command, stderr io.Writer) error {
	var old []string // in the order of the flag set: sorted by name
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if len(f.Annotations[renamedTo]) > 0 {
			old = append(old, f.Name)
		}
	})
	for _, name := range old {
		current := cmd.Flags().Lookup(name).Annotations[renamedTo][0]
		if cmd.Flags().Changed(current) {
			return fmt.Errorf("--%s is the deprecated spelling of --%s: give one of them", name, current)
		}
		deprecated(stderr, "--"+name, "--"+current)
	}
	return nil
}

// deprecated writes the warning that old is deprecated in favour of current.
func deprecated(stderr io.Writer, old, current string) {
	fmt.Fprintf(stderr, "clusterip: warning: %s is deprecated and will be removed in the next release; use %s\n", old, current)
}
