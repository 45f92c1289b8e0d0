// Command kustomizebuild renders kustomizations as "kubectl kustomize" does (sigs.k8s.io/kustomize/api's
// krusty, its default options: load restrictions to the kustomization's root, no plugins) and writes
// the objects of each directory it is given to stdout as one multi-document YAML stream.
//
// It is a module of its own, outside the workspace, so that kustomize's dependencies never enter
// the library's, the command's or the system tests' module graphs: the tests run it with
// GOWORK=off (see testenv.Kustomize).
//
// Usage:
//
//	GOWORK=off go run . DIR...
package main

import (
	"fmt"
	"io"
	"os"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kustomizebuild DIR...")
		os.Exit(2)
	}
	if err := build(os.Stdout, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kustomizebuild: "+err.Error())
		os.Exit(1)
	}
}

// build renders each of dirs, in order, and writes their objects to w, each document after a
// "---" line.
func build(w io.Writer, dirs []string) error {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	fs := filesys.MakeFsOnDisk()
	for _, dir := range dirs {
		m, err := k.Run(fs, dir)
		if err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
		for _, r := range m.Resources() {
			b, err := r.AsYAML()
			if err != nil {
				return fmt.Errorf("%s: %s: %w", dir, r.CurId(), err)
			}
			if _, err := fmt.Fprintf(w, "---\n%s", b); err != nil {
				return err
			}
		}
	}
	return nil
}
