package bitmap_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
)

// Example_readme is the program of README.md's example; TestREADMEExampleIsExampleReadme keeps the
// two the same.
func Example_readme() {
	ctx := context.Background()
	// kube-apiserver's legacy allocator for --service-cluster-ip-range=10.96.0.0/24, in memory.
	a, err := bitmap.New(netip.MustParsePrefix("10.96.0.0/24"))
	if err != nil {
		log.Fatal(err)
	}
	web := allocator.Owner{Resource: "services", Namespace: "default", Name: "web"}
	dns := allocator.Owner{Resource: "services", Namespace: "kube-system", Name: "kube-dns"}

	// A Service that asks for no address gets a random one of the dynamic band (10.96.0.17 and up).
	ip, err := a.AllocateNext(ctx, web)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("dynamic band:", !ip.Less(netip.MustParseAddr("10.96.0.17")))

	// A Service that asks for 10.96.0.10 gets it, and only once.
	fmt.Println(a.Allocate(ctx, netip.MustParseAddr("10.96.0.10"), dns))
	err = a.Allocate(ctx, netip.MustParseAddr("10.96.0.10"), web)
	fmt.Println(errors.Is(err, allocator.ErrAllocated))

	// Release is idempotent.
	fmt.Println(a.Release(ctx, ip), a.Release(ctx, ip))
	fmt.Println(a.Used(), "used,", a.Free(), "free")
	// Output:
	// dynamic band: true
	// <nil>
	// true
	// <nil> <nil>
	// 1 used, 253 free
}

// TestREADMEExampleIsExampleReadme checks that the body of main in README.md's example is the body
// of Example_readme, so that README shows a program that compiles and prints what it says.
func TestREADMEExampleIsExampleReadme(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("readme_example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	want, ok := between(src, "func Example_readme() {\n", "\t// Output:")
	if !ok {
		t.Fatal("cannot find the body of Example_readme")
	}
	got, ok := between(readme, "func main() {\n", "}\n```")
	if !ok {
		t.Fatal("README.md has no ```go block with a func main")
	}
	if diff := cmp.Diff(lines(want), lines(got)); diff != "" {
		t.Errorf("README.md's main differs from Example_readme (-want +got):\n%s", diff)
	}
}

// between returns the text of b after the first start and before the next end.
func between(b []byte, start, end string) (string, bool) {
	_, rest, ok := bytes.Cut(b, []byte(start))
	if !ok {
		return "", false
	}
	body, _, ok := bytes.Cut(rest, []byte(end))
	return string(body), ok
}

// lines splits s into lines without their indentation or blank lines.
func lines(s string) []string {
	var out []string
	for l := range strings.Lines(s) {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}
