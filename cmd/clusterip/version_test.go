package main

import (
	"runtime/debug"
	"testing"
)

func TestCommandNameIsKubectlsForAPlugin(t *testing.T) {
	tests := []struct {
		argv0 string
		want  string
	}{
		{"clusterip", "clusterip"},
		{"./clusterip", "clusterip"},
		{"/usr/local/bin/clusterip-v0.1.0", "clusterip"},
		{"/usr/local/bin/kubectl-clusterip", "kubectl clusterip"},
		{"kubectl-clusterip", "kubectl clusterip"},
		{"kubectl-clusterip.EXE", "kubectl clusterip"},
		{"kubectl-ipam-clusterip", "kubectl ipam clusterip"}, // a dash separates words
		{"kubectl-cluster_ip", "kubectl cluster-ip"},         // an underscore is a dash
		{"kubectl-", "clusterip"},
		{"kubectl", "clusterip"},
	}
	for _, tt := range tests {
		t.Run(tt.argv0, func(t *testing.T) {
			if got := commandName(tt.argv0); got != tt.want {
				t.Errorf("commandName(%q) = %q, want %q", tt.argv0, got, tt.want)
			}
		})
	}
}

func TestCurrentVersionIsTheMainModules(t *testing.T) {
	tests := []struct {
		name    string
		build   *debug.BuildInfo
		stamped string
		want    string
	}{
		{"go install …@v0.1.0", &debug.BuildInfo{Main: debug.Module{Path: "github.com/kube-ipam/clusterip/cmd/clusterip", Version: "v0.1.0"}}, "", "v0.1.0"},
		{"a pseudo-version", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20260101000000-0123456789ab+dirty"}}, "", "v0.0.0-20260101000000-0123456789ab+dirty"},
		{"a work tree", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "", "(devel)"},
		{"an image's work tree build", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "v0.1.0", "v0.1.0"},
		{"stamped wins", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.9"}}, "v0.1.0", "v0.1.0"},
		{"stamped, no build information", nil, "v0.1.0", "v0.1.0"},
		{"no version", &debug.BuildInfo{}, "", "(unknown)"},
		{"no build information", nil, "", "(unknown)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := currentVersion(tt.build, tt.stamped).ClusteripVersion; got != tt.want {
				t.Errorf("currentVersion(%+v, %q).ClusteripVersion = %q, want %q", tt.build, tt.stamped, got, tt.want)
			}
		})
	}
}
