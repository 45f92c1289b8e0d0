package testenv

import (
	"flag"
	"testing"
)

func TestMainBuildsFirstUnlessShortOrATargetedRun(t *testing.T) {
	tests := []struct {
		name              string
		short, run, bench string
		want              bool
	}{
		{name: "whole package", short: "false", want: true},
		{name: "-short", short: "true", want: false},
		{name: "-run", short: "false", run: "TestX", want: false},
		{name: "-run with -bench", short: "false", run: "XXX", bench: ".", want: true},
		{name: "-bench", short: "false", bench: ".", want: true},
		{name: "-short with -bench", short: "true", bench: ".", want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setFlag(t, "test.short", tt.short)
			setFlag(t, "test.run", tt.run)
			setFlag(t, "test.bench", tt.bench)
			if got := prebuild(); got != tt.want {
				t.Errorf("prebuild() with -short=%s -run=%q -bench=%q = %v, want %v", tt.short, tt.run, tt.bench, got, tt.want)
			}
		})
	}
}

// setFlag sets a flag of the test binary for the rest of t.
func setFlag(t *testing.T, name, value string) {
	t.Helper()
	f := flag.Lookup(name)
	if f == nil {
		t.Fatalf("no flag %s", name)
	}
	old := f.Value.String()
	if err := flag.Set(name, value); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { flag.Set(name, old) })
}
