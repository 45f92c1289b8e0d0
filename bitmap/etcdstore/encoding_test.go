package etcdstore_test

import (
	"bytes"
	"errors"
	"net/netip"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"

	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
)

// goldenFile is the value a real kube-apiserver v1.33.13 (legacy allocator,
// --service-cluster-ip-range=10.96.0.0/24) stored at /registry/ranges/serviceips right after
// start-up, with only 10.96.0.1 (offset 0) allocated. It is a copy of
// ../../../shared/testdata/rangeallocation-kube-apiserver-v1.33.13.bin (see the README there),
// kept inside the module so that the module's tests need nothing beside it.
const goldenFile = "testdata/rangeallocation-kube-apiserver-v1.33.13.bin"

func readGolden(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(goldenFile)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decodeWithAPIMachinery decodes a stored value independently of the package under test, with
// kube-apiserver's own machinery: a scheme with core/v1 and the universal deserializer.
func decodeWithAPIMachinery(t *testing.T, value []byte) *corev1.RangeAllocation {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	obj, gvk, err := serializer.NewCodecFactory(scheme).UniversalDeserializer().Decode(value, nil, nil)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	ra, ok := obj.(*corev1.RangeAllocation)
	if !ok {
		t.Fatalf("decoded %v (%T), want a RangeAllocation", gvk, obj)
	}
	return ra
}

func TestDecodeGoldenFromKubeAPIServer(t *testing.T) {
	got, err := etcdstore.Decode(readGolden(t))
	if err != nil {
		t.Fatal(err)
	}
	want := bitmap.Snapshot{Range: "10.96.0.0/24", Data: []byte{0x01}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Decode(golden) mismatch (-want +got):\n%s", diff)
	}
	// And the bitmap it holds is the kubernetes Service's 10.96.0.1 alone.
	a, err := bitmap.New(netip.MustParsePrefix("10.96.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Restore(got); err != nil {
		t.Fatal(err)
	}
	if a.Used() != 1 || !a.Has(netip.MustParseAddr("10.96.0.1")) {
		t.Errorf("restored golden: Used() = %d, Has(10.96.0.1) = %v; want 1, true", a.Used(), a.Has(netip.MustParseAddr("10.96.0.1")))
	}
}

// TestEncodeMatchesGolden encodes the golden's state and checks, field by field, that
// kube-apiserver's machinery decodes it to what it decodes the golden to. Metadata such as
// creationTimestamp is allowed to differ (kube-apiserver writes none here, and neither do we).
func TestEncodeMatchesGolden(t *testing.T) {
	golden := readGolden(t)
	value, err := etcdstore.Encode(bitmap.Snapshot{Range: "10.96.0.0/24", Data: []byte{0x01}}, etcdstore.Protobuf)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(value, []byte("k8s\x00")) {
		t.Errorf("Encode() = %q..., want the k8s\\x00 protobuf envelope", value[:min(len(value), 8)])
	}
	want, got := decodeWithAPIMachinery(t, golden), decodeWithAPIMachinery(t, value)
	ignoreMeta := cmpopts.IgnoreFields(metav1.ObjectMeta{}, "CreationTimestamp", "ResourceVersion", "UID", "Generation", "ManagedFields")
	if diff := cmp.Diff(want, got, ignoreMeta); diff != "" {
		t.Errorf("RangeAllocation mismatch (-golden +ours):\n%s", diff)
	}
	// Not required (metadata may differ), but worth knowing when it stops being true.
	t.Logf("byte-identical to kube-apiserver's value: %v", bytes.Equal(value, golden))
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		snap bitmap.Snapshot
	}{
		{name: "empty", snap: bitmap.Snapshot{Range: "10.96.0.0/24"}},
		{name: "offset 0", snap: bitmap.Snapshot{Range: "10.96.0.0/24", Data: []byte{0x01}}},
		{name: "several bytes", snap: bitmap.Snapshot{Range: "10.96.0.0/12", Data: []byte{0x80, 0, 0, 0xff, 0x01}}},
		{name: "IPv6", snap: bitmap.Snapshot{Range: "fd00::/108", Data: []byte{0x03}}},
	}
	for _, tt := range tests {
		for _, f := range []etcdstore.Format{etcdstore.Protobuf, etcdstore.JSON} {
			t.Run(tt.name+"/"+f.String(), func(t *testing.T) {
				value, err := etcdstore.Encode(tt.snap, f)
				if err != nil {
					t.Fatal(err)
				}
				got, err := etcdstore.Decode(value)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tt.snap, got, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("Decode(Encode()) mismatch (-want +got):\n%s", diff)
				}
				ra := decodeWithAPIMachinery(t, value)
				if ra.Kind != "RangeAllocation" || ra.APIVersion != "v1" {
					t.Errorf("stored TypeMeta = %+v, want v1 RangeAllocation", ra.TypeMeta)
				}
			})
		}
	}
}

func TestDecodeRejectsForeignValues(t *testing.T) {
	svc, err := runtime.Encode(jsonCodec(t), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "x"}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		value []byte
	}{
		{name: "empty", value: nil},
		{name: "garbage", value: []byte("not a kubernetes object")},
		{name: "truncated protobuf", value: readGolden(t)[:20]},
		{name: "protobuf envelope, garbage inside", value: []byte("k8s\x00\xff\xff\xff")},
		{name: "another kind", value: svc},
		{name: "unregistered kind", value: []byte(`{"apiVersion":"v1","kind":"NoSuchThing"}`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := etcdstore.Decode(tt.value)
			if !errors.Is(err, bitmap.ErrCorrupt) {
				t.Errorf("Decode() error = %v, want ErrCorrupt", err)
			}
		})
	}
}

func jsonCodec(t *testing.T) runtime.Encoder {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	codecs := serializer.NewCodecFactory(scheme)
	info, _ := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	return codecs.WithoutConversion().EncoderForVersion(info.Serializer, corev1.SchemeGroupVersion)
}

func TestKeys(t *testing.T) {
	tests := []struct {
		prefix, primary, secondary string
	}{
		{"", "/registry/ranges/serviceips", "/registry/ranges/secondaryserviceips"},
		{"/registry", "/registry/ranges/serviceips", "/registry/ranges/secondaryserviceips"},
		{"/registry/", "/registry/ranges/serviceips", "/registry/ranges/secondaryserviceips"},
		{"custom", "/custom/ranges/serviceips", "/custom/ranges/secondaryserviceips"},
	}
	for _, tt := range tests {
		if got := etcdstore.ServiceIPsKey(tt.prefix); got != tt.primary {
			t.Errorf("ServiceIPsKey(%q) = %q, want %q", tt.prefix, got, tt.primary)
		}
		if got := etcdstore.SecondaryServiceIPsKey(tt.prefix); got != tt.secondary {
			t.Errorf("SecondaryServiceIPsKey(%q) = %q, want %q", tt.prefix, got, tt.secondary)
		}
		if got := etcdstore.KeyFor(tt.prefix, 0); got != tt.primary {
			t.Errorf("KeyFor(%q, 0) = %q, want %q", tt.prefix, got, tt.primary)
		}
		if got := etcdstore.KeyFor(tt.prefix, 1); got != tt.secondary {
			t.Errorf("KeyFor(%q, 1) = %q, want %q", tt.prefix, got, tt.secondary)
		}
	}
	if etcdstore.DefaultServiceIPsKey != etcdstore.ServiceIPsKey("") || etcdstore.DefaultSecondaryServiceIPsKey != etcdstore.SecondaryServiceIPsKey("") {
		t.Error("Default keys differ from the keys for the default prefix")
	}
}
