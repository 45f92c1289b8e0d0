package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
)

func main() {
	// SIGTERM too, which a kubelet sends a Pod's containers: "reservations webhook" then drains.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runAs(ctx, commandName(os.Args[0]), os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// The command's exit codes.
const (
	exitOK          = 0 // the command did its job
	exitProblem     = 1 // it ran and found a problem (check, repair: the cluster is, or stays, inconsistent)
	exitCouldNotRun = 2 // it could not run: bad flags, unreachable components, failures
)

// exitError carries an exit code other than exitCouldNotRun out of a command. Its message, if
// any, is printed as the one line on stderr.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit code %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// run runs the command line args of the command named clusterip and returns the process's exit
// code. Every failure is reported as one line on stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runAs(ctx, "clusterip", args, stdout, stderr)
}

// runAs is run for the command invoked as name: "clusterip", or "kubectl clusterip" for the
// kubectl plugin (see commandName).
func runAs(ctx context.Context, name string, args []string, stdout, stderr io.Writer) int {
	root := newRootCommand(name, stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	code := exitCouldNotRun
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
		if ee.err == nil {
			return code
		}
	}
	fmt.Fprintln(stderr, "clusterip: "+oneLine(err.Error()))
	return code
}

// oneLine folds a multi-line message into one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}

// rootLong is the root command's help; buildLong says what this build of the command is for.
const rootLong = `clusterip allocates Kubernetes Service ClusterIPs with kube-apiserver's exact semantics and
storage formats. ` + buildLong + `

check only reads; repair writes, and with --dry-run only says what it would change.

Exit codes: 0 the command did its job; 1 it ran and found a problem; 2 it could not run (bad flags
included), with one line on stderr saying why.`

// rootExample is the root command's examples: those of the verbs every build has, and the demo's
// and bench's where the build has them (rootDemoExample and rootBenchExample, empty otherwise).
const rootExample = rootDemoExample + `  # Audit the cluster of the current kubeconfig context, then see what repair would change
  clusterip check
  clusterip repair --dry-run

` + rootBenchExample + `  # Enable bash completion in the current shell
  source <(clusterip completion bash)`

// unknownCommand refuses any argument of a command that takes none (the root command: args[0]
// is a verb it does not know) and suggests the verbs it may be a typo of, as cobra and kubectl
// do: those within Levenshtein distance 2, ignoring case, or that begin with it. Cobra's own
// suggestions are not offered once the root command validates its arguments, and span lines.
func unknownCommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; Did you mean this? " + strings.Join(s, ", ")
	}
	return fmt.Errorf("%s (see '%s --help')", msg, cmd.CommandPath())
}

// pluginPrefix is the start of the name of a kubectl plugin's executable: kubectl runs
// kubectl-clusterip, found on PATH, for "kubectl clusterip".
const pluginPrefix = "kubectl-"

// commandName returns the name the command is invoked as, from argv0: "kubectl clusterip" when
// the executable is a kubectl plugin named kubectl-clusterip (kubectl's plugin naming: a dash
// separates words, an underscore stands for a dash), "clusterip" under any other name.
func commandName(argv0 string) string {
	base := filepath.Base(argv0)
	if ext := filepath.Ext(base); strings.EqualFold(ext, ".exe") {
		base = strings.TrimSuffix(base, ext)
	}
	words, ok := strings.CutPrefix(base, pluginPrefix)
	if !ok || words == "" {
		return "clusterip"
	}
	return "kubectl " + strings.ReplaceAll(strings.ReplaceAll(words, "-", " "), "_", "-")
}

// examplePrompt finds the command's name where an example runs it: at the start of a line or
// after a space or "(" (as in "source <(clusterip completion bash)"), followed by a space or the
// end of the line.
var examplePrompt = regexp.MustCompile(`(?m)(^|[\s(])clusterip( |$)`)

// renameExamples makes the examples of c and its subcommands run the command as name.
func renameExamples(c *cobra.Command, name string) {
	c.Example = examplePrompt.ReplaceAllString(c.Example, "${1}"+name+"${2}")
	for _, sub := range c.Commands() {
		renameExamples(sub, name)
	}
}

// newRootCommand builds the command tree for the command invoked as name (see commandName),
// writing to stdout and stderr. Its usage lines, examples and error messages name the command
// as invoked. It keeps no global state: klog's flags are bound to a flag set of this command.
func newRootCommand(name string, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "clusterip",
		Short:         "Allocate Kubernetes Service ClusterIPs as kube-apiserver does",
		Long:          rootLong,
		Example:       rootExample,
		Args:          unknownCommand,
		SilenceUsage:  true,
		SilenceErrors: true,
		// cobra's default, which SuggestionsFor applies only if it is set
		SuggestionsMinimumDistance: 2,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fmt.Errorf("no command given; see '%s --help'", cmd.CommandPath())
		},
	}
	if name != "clusterip" {
		// cobra names the command so in usage lines, help and messages (CommandPath).
		root.Annotations = map[string]string{cobra.CommandDisplayNameAnnotation: name}
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return fmt.Errorf("%w (see --help)", err)
	})
	// klog's flags, -v among them, as kubectl has them.
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	root.PersistentFlags().AddGoFlagSet(klogFlags)
	// Only the verbosity flags are shown; the rest work as in every klog program.
	klogFlags.VisitAll(func(f *flag.Flag) {
		if f.Name != "v" && f.Name != "vmodule" {
			_ = root.PersistentFlags().MarkHidden(f.Name)
		}
	})

	// The slim build has no demo and no bench (buildVerbs returns none), so its help and its
	// completion do not offer them and "clusterip demo" is an unknown command there.
	root.AddCommand(buildVerbs()...)
	root.AddCommand(
		newCheckCommand(),
		newRepairCommand(),
		newReservationsCommand(),
		newVersionCommand(),
	)
	setUpCompletion(root)
	if name != "clusterip" {
		renameExamples(root, name)
	}
	return root
}
