package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestDemoAllocatesThroughTwoAllocatorsSharingEmbeddedEtcd(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"demo", "-cidr", "10.96.0.0/24", "-n", "200", "-workers", "2"}, &out, &errOut)
	if err != nil {
		t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errOut.String())
	}
	for _, want := range []string{
		"range 10.96.0.0/24: 254 addresses, static band of 16",
		"key /registry/ranges/serviceips",
		"allocated 200 addresses",
		"duplicates 0",
		"B released 100 addresses; A reads the stored bitmap back: 100 used, 154 free",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestCommandLineRejectsBadInput(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "no command"},
		{"unknown command", []string{"frobnicate"}, "unknown command"},
		{"IPv4-mapped range", []string{"demo", "-cidr", "::ffff:10.0.0.0/120"}, "IPv4-mapped"},
		{"a /32", []string{"demo", "-cidr", "10.0.0.1/32"}, "no usable addresses"},
		{"host bits", []string{"demo", "-cidr", "10.96.0.1/24"}, "host bits set"},
		{"two IPv4 ranges", []string{"demo", "-service-cluster-ip-range", "10.96.0.0/24,10.97.0.0/24"}, "same IP family"},
		{"a bad second range", []string{"demo", "-service-cluster-ip-range", "10.96.0.0/24,fd00::/200"}, "fd00::/200"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), tt.args, &out, &errOut)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("run(%q) = %v, want an error containing %q", tt.args, err, tt.want)
			}
		})
	}
}
