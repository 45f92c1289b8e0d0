package bitmap_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
)

var update = flag.Bool("update", false, "rewrite testdata/snapshots.golden")

// snapshotCases are the states whose encodings testdata/snapshots.golden pins. The first is the
// state kube-apiserver v1.33.13 stored on start-up (../shared/testdata): 10.96.0.1 taken, Data 01.
var snapshotCases = []struct {
	cidr    string
	offsets []int
}{
	{"10.96.0.0/24", []int{0}},
	{"10.96.0.0/24", nil},
	{"10.96.0.0/24", []int{7, 8, 253}},
	{"10.96.0.0/28", []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}},
	{"10.96.0.0/12", []int{255, 256, 1048573}},
	{"fd00::/108", []int{0, 65534}},
	{"fd00::/120", []int{1, 64, 128, 254}},
}

func TestSnapshotMatchesGolden(t *testing.T) {
	var out strings.Builder
	for _, c := range snapshotCases {
		a, err := bitmap.New(netip.MustParsePrefix(c.cidr))
		if err != nil {
			t.Fatal(err)
		}
		for _, off := range c.offsets {
			ip := netip.MustParsePrefix(c.cidr).Addr()
			for range off + 1 {
				ip = ip.Next()
			}
			if err := a.Allocate(context.Background(), ip, allocator.Owner{}); err != nil {
				t.Fatal(err)
			}
		}
		s := a.Snapshot()
		fmt.Fprintf(&out, "%s %v %s %x\n", c.cidr, strings.Trim(fmt.Sprint(c.offsets), "[]"), s.Range, s.Data)
		// Restoring the snapshot into a fresh allocator gives the same allocations.
		b, _ := bitmap.New(netip.MustParsePrefix(c.cidr))
		if err := b.Restore(s); err != nil {
			t.Fatalf("Restore(Snapshot()) = %v", err)
		}
		if b.Used() != uint64(len(c.offsets)) {
			t.Errorf("%s: Used() after Restore = %d, want %d", c.cidr, b.Used(), len(c.offsets))
		}
		for ip := range a.All() {
			if !b.Has(ip) {
				t.Errorf("%s: %v lost in Snapshot/Restore", c.cidr, ip)
			}
		}
	}
	const golden = "testdata/snapshots.golden"
	if *update {
		if err := os.WriteFile(golden, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), out.String()); diff != "" {
		t.Errorf("snapshots differ from %s (-want +got):\n%s", golden, diff)
	}
}

// TestGoldenIsMathBigEncoding checks the golden file itself against the encoding kube-apiserver
// uses, math/big's Int.Bytes of the bit set, computed independently of the bitset code.
func TestGoldenIsMathBigEncoding(t *testing.T) {
	f, err := os.Open("testdata/snapshots.golden")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), " ")
		cidr, spec, data := fields[0], fields[len(fields)-2], fields[len(fields)-1]
		if spec != cidr {
			t.Errorf("range spec %q, want %q", spec, cidr)
		}
		want := bigIntBytes(t, fields[1:len(fields)-2])
		if data != hex.EncodeToString(want) {
			t.Errorf("%s %v: data %s, want %x", cidr, fields[1:len(fields)-2], data, want)
		}
	}
}

func TestRestoreRejectsOtherRangesAndCorruptData(t *testing.T) {
	a, _ := bitmap.New(netip.MustParsePrefix("10.96.0.0/24"))
	_ = a.Allocate(context.Background(), netip.MustParseAddr("10.96.0.5"), allocator.Owner{})
	tests := []struct {
		name string
		spec string
		data []byte
		want error
	}{
		{"other range", "10.97.0.0/24", []byte{1}, allocator.ErrMismatchedNetwork},
		{"other size", "10.96.0.0/23", []byte{1}, allocator.ErrMismatchedNetwork},
		{"unparsable range", "10.96.0.0", []byte{1}, bitmap.ErrCorrupt},
		{"bit beyond the range", "10.96.0.0/24", append([]byte{0x40}, make([]byte, 31)...), bitmap.ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := a.Restore(bitmap.Snapshot{Range: tt.spec, Data: tt.data}); !errors.Is(err, tt.want) {
				t.Errorf("Restore(%q) = %v, want %v", tt.spec, err, tt.want)
			}
			if !a.Has(netip.MustParseAddr("10.96.0.5")) || a.Used() != 1 {
				t.Errorf("a rejected Restore changed the allocator")
			}
		})
	}
	// A non-canonical spelling of the same range is the same range.
	if err := a.Restore(bitmap.Snapshot{Range: "10.96.0.1/24"}); err != nil {
		t.Errorf("Restore(10.96.0.1/24) = %v, want nil", err)
	}
}

func bigIntBytes(t *testing.T, offsets []string) []byte {
	t.Helper()
	var words []byte // little-endian bytes
	for _, o := range offsets {
		if o == "" {
			continue
		}
		i, err := strconv.Atoi(o)
		if err != nil {
			t.Fatal(err)
		}
		for len(words) <= i/8 {
			words = append(words, 0)
		}
		words[i/8] |= 1 << (i % 8)
	}
	for len(words) > 0 && words[len(words)-1] == 0 {
		words = words[:len(words)-1]
	}
	be := make([]byte, len(words))
	for i, b := range words {
		be[len(words)-1-i] = b
	}
	return be
}
