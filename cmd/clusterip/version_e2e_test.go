package main

import (
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// builtVersion returns what "clusterip version" of the built command should print: its module
// version is the one the go command stamped into it ("(devel)", or a pseudo-version when built
// with version control information).
func builtVersion(t *testing.T) versionInfo {
	t.Helper()
	bi, err := buildinfo.ReadFile(binary)
	if err != nil {
		t.Fatalf("read the build information of %s: %v", binary, err)
	}
	return versionInfo{
		ClusteripVersion: bi.Main.Version,
		GoVersion:        runtime.Version(),
		Platform:         runtime.GOOS + "/" + runtime.GOARCH,
		KubeAPIServer: kubeAPIServerVersions{
			Releases: []string{"1.33", "1.35", "1.36", "1.37", "1.38"},
			Default:  "1.37.2",
			Newest:   "1.38.0-beta.0",
			Demo:     "v1.33.13",
		},
	}
}

func TestVersionPrintsModuleGoAndKubeAPIServerReleases(t *testing.T) {
	want := builtVersion(t)
	wantText := fmt.Sprintf("clusterip %s\ngo %s %s\nkube-apiserver 1.33, 1.35, 1.36, 1.37, 1.38 (default 1.37.2, newest 1.38.0-beta.0; the demo runs v1.33.13)\n",
		want.ClusteripVersion, runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH)
	tests := []struct {
		name       string
		args       []string
		unmarshal  func([]byte, any) error // nil: the text form
		wantStderr string
	}{
		{name: "text", args: []string{"version"}},
		{name: "json", args: []string{"version", "-o", "json"}, unmarshal: json.Unmarshal},
		{name: "json, long flag", args: []string{"version", "--output=json"}, unmarshal: json.Unmarshal},
		{name: "yaml", args: []string{"version", "-o", "yaml"}, unmarshal: func(b []byte, v any) error { return yaml.UnmarshalStrict(b, v) }},
		{name: "deprecated --json", args: []string{"version", "--json"}, unmarshal: json.Unmarshal,
			wantStderr: "clusterip: warning: --json is deprecated and will be removed in the next release; use -o json\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := clusterip(t, tt.args...)
			if r.code != 0 || r.stderr != tt.wantStderr {
				t.Fatalf("clusterip %q: exit %d, stderr %q; want 0 and %q", tt.args, r.code, r.stderr, tt.wantStderr)
			}
			if tt.unmarshal == nil {
				if diff := cmp.Diff(wantText, r.stdout); diff != "" {
					t.Errorf("clusterip %q (-want +got):\n%s", tt.args, diff)
				}
				return
			}
			var got versionInfo
			if err := tt.unmarshal([]byte(r.stdout), &got); err != nil {
				t.Fatalf("decode %q: %v", r.stdout, err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("clusterip %q (-want +got):\n%s", tt.args, diff)
			}
		})
	}
}

func TestVersionRefusesBadOutputBeforePrinting(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown format", []string{"version", "-o", "xml"}, `unable to match a printer suitable for the output format "xml", allowed formats are: json,yaml`},
		{"kubectl's wide", []string{"version", "-o", "wide"}, `unable to match a printer suitable for the output format "wide", allowed formats are: json,yaml`},
		{"--json and -o", []string{"version", "--json", "-o", "yaml"}, "--json is the deprecated spelling of -o json: give one of them"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkCouldNotRun(t, tt.args, tt.want)
			if r := clusterip(t, tt.args...); r.stdout != "" {
				t.Errorf("clusterip %q printed %q on stdout, want nothing", tt.args, r.stdout)
			}
		})
	}
}

// TestKubectlPluginNameShowsInHelp installs the command as kubectl installs plugins, an
// executable kubectl-clusterip, and checks that its help, examples and messages name it
// "kubectl clusterip"; with kubectl on PATH, also run through kubectl.
func TestKubectlPluginNameShowsInHelp(t *testing.T) {
	dir := t.TempDir()
	plugin := filepath.Join(dir, "kubectl-clusterip")
	if err := os.Symlink(binary, plugin); err != nil {
		t.Fatal(err)
	}
	copied := filepath.Join(t.TempDir(), "kubectl-clusterip")
	data, err := os.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(copied, data, 0o755); err != nil {
		t.Fatal(err)
	}
	kubectl, kubectlErr := exec.LookPath("kubectl")

	tests := []struct {
		name       string
		argv       []string // the plugin's command line
		code       int
		wantOut    []string // lines stdout must have
		wantErr    string   // what stderr must contain
		notWithout string   // a word stdout must never have without "kubectl " before it
		kubectl    bool     // argv runs kubectl, which finds the plugin on PATH
	}{
		{name: "root help", argv: []string{plugin, "--help"},
			wantOut:    []string{"  kubectl clusterip [command]", "  kubectl clusterip check", "  source <(kubectl clusterip completion bash)", "  -h, --help                 help for kubectl clusterip"},
			notWithout: "clusterip check"},
		{name: "a copy under the plugin name", argv: []string{copied, "--help"},
			wantOut: []string{"  kubectl clusterip [command]"}},
		{name: "verb help", argv: []string{plugin, "check", "--help"},
			wantOut:    []string{"  kubectl clusterip check [flags]", "  kubectl clusterip check"},
			notWithout: "clusterip check"},
		{name: "version help", argv: []string{plugin, "version", "--help"},
			wantOut: []string{"  kubectl clusterip version [flags]", "  kubectl clusterip version -o json"}},
		{name: "a mistyped verb", argv: []string{plugin, "chek"}, code: exitCouldNotRun,
			wantErr: `unknown command "chek" for "kubectl clusterip"; Did you mean this? check (see 'kubectl clusterip --help')`},
		{name: "no verb", argv: []string{plugin}, code: exitCouldNotRun,
			wantErr: "no command given; see 'kubectl clusterip --help'"},
		{name: "through kubectl", argv: []string{kubectl, "clusterip", "--help"}, kubectl: true,
			wantOut: []string{"  kubectl clusterip [command]"}},
		{name: "version through kubectl", argv: []string{kubectl, "clusterip", "version", "-o", "json"}, kubectl: true,
			wantOut: []string{`  "clusteripVersion": "` + builtVersion(t).ClusteripVersion + `",`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.kubectl && kubectlErr != nil {
				t.Skipf("no kubectl on PATH: %v", kubectlErr)
			}
			cmd := exec.CommandContext(t.Context(), tt.argv[0], tt.argv[1:]...)
			// kubectl finds the plugin on PATH.
			cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			code := 0
			if err := cmd.Run(); err != nil {
				ee, ok := err.(*exec.ExitError)
				if !ok {
					t.Fatalf("run %q: %v", tt.argv, err)
				}
				code = ee.ExitCode()
			}
			if code != tt.code || !strings.Contains(stderr.String(), tt.wantErr) {
				t.Errorf("%q: exit %d, stderr %q; want exit %d and stderr containing %q", tt.argv, code, stderr.String(), tt.code, tt.wantErr)
			}
			lines := strings.Split(stdout.String(), "\n")
			for _, want := range tt.wantOut {
				if !containsLine(lines, want) {
					t.Errorf("%q printed no line %q:\n%s", tt.argv, want, stdout.String())
				}
			}
			if tt.notWithout != "" && strings.Count(stdout.String(), tt.notWithout) != strings.Count(stdout.String(), "kubectl "+tt.notWithout) {
				t.Errorf("%q printed %q without \"kubectl \" before it:\n%s", tt.argv, tt.notWithout, stdout.String())
			}
		})
	}
}

// containsLine reports whether lines has want, or a line that begins with want and then a space.
func containsLine(lines []string, want string) bool {
	for _, l := range lines {
		if l == want || strings.HasPrefix(l, want+" ") {
			return true
		}
	}
	return false
}
