package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// setUpCompletion adds cobra's completion command to root now rather than when root runs, so
// that it refuses what it does not know as every verb does: "completion badshell" exits 2 with
// one line naming the shells, where cobra's own prints its help and exits 0. Its subcommands,
// bash, zsh, fish and powershell, print the scripts as cobra writes them; the scripts complete
// the verbs, the flags, -o's values and --context (and --cluster, --user) from the kubeconfig by
// asking the command itself.
func setUpCompletion(root *cobra.Command) {
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() != "completion" {
			continue
		}
		c.Args = unknownCommand
		c.RunE = func(*cobra.Command, []string) error {
			return errors.New("no shell given: bash, zsh, fish or powershell (see --help)")
		}
	}
}
