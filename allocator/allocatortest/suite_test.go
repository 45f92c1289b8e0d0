package allocatortest_test

import (
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/allocator/allocatortest"
	"github.com/kube-ipam/clusterip/bitmap"
)

// helperEnv names the case a re-executed test binary runs in TestRunHelper.
const helperEnv = "ALLOCATORTEST_HELPER"

// TestRunHelper is not a test of its own: TestRunFailsOnNilInput re-executes the test binary to run
// it, because the case must fail its *testing.T.
func TestRunHelper(t *testing.T) {
	switch os.Getenv(helperEnv) {
	case "":
		t.Skip("run by TestRunFailsOnNilInput")
	case "nil factory":
		allocatortest.Run(t, nil, nil)
	case "nil allocator":
		allocatortest.Run(t, func(*testing.T, netip.Prefix) allocator.Interface { return nil })
	case "nil *bitmap.Allocator":
		allocatortest.Run(t, func(*testing.T, netip.Prefix) allocator.Interface { return (*bitmap.Allocator)(nil) })
	case "valid, nil Option":
		allocatortest.Run(t, func(t *testing.T, cidr netip.Prefix) allocator.Interface {
			a, err := bitmap.New(cidr)
			if err != nil {
				t.Fatal(err)
			}
			return a
		}, nil, allocatortest.Workers(2), nil)
	}
}

// TestRunFailsOnNilInput checks that Run fails its test, without a panic, when given a nil Factory
// or a Factory that returns nil, and that nil Options are ignored.
func TestRunFailsOnNilInput(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	tests := []struct {
		name     string
		wantFail string // "" means the run must pass
	}{
		{"nil factory", "Run needs a Factory, got nil"},
		{"nil allocator", "the Factory returned a nil allocator"},
		{"nil *bitmap.Allocator", "the Factory returned a nil *bitmap.Allocator"},
		{"valid, nil Option", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestRunHelper$", "-test.v")
			cmd.Env = append(os.Environ(), helperEnv+"="+tt.name)
			out, err := cmd.CombinedOutput()
			if strings.Contains(string(out), "panic") {
				t.Fatalf("Run panicked:\n%s", out)
			}
			if tt.wantFail == "" {
				if err != nil {
					t.Errorf("Run failed: %v\n%s", err, out)
				}
				return
			}
			if err == nil || !strings.Contains(string(out), tt.wantFail) {
				t.Errorf("Run = %v, output:\n%s\nwant a failure saying %q", err, out, tt.wantFail)
			}
		})
	}
}
