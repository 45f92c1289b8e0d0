package etcdstore

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"path"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
)

// Keys of kube-apiserver's Service IP bitmaps.
const (
	// DefaultPrefix is kube-apiserver's default --etcd-prefix.
	DefaultPrefix = "/registry"
	// ServiceIPsPath is the key of the primary IP family's bitmap, below the prefix.
	ServiceIPsPath = "ranges/serviceips"
	// SecondaryServiceIPsPath is the key of the secondary IP family's bitmap, below the prefix.
	SecondaryServiceIPsPath = "ranges/secondaryserviceips"
	// DefaultServiceIPsKey is the key of the primary family's bitmap under DefaultPrefix.
	DefaultServiceIPsKey = DefaultPrefix + "/" + ServiceIPsPath
	// DefaultSecondaryServiceIPsKey is the key of the secondary family's bitmap under
	// DefaultPrefix.
	DefaultSecondaryServiceIPsKey = DefaultPrefix + "/" + SecondaryServiceIPsPath
)

// ServiceIPsKey returns the key kube-apiserver started with --etcd-prefix=prefix keeps the primary
// IP family's bitmap at: "/registry/ranges/serviceips" for the default prefix. An empty prefix
// means DefaultPrefix; a prefix without a leading slash gets one, as in kube-apiserver.
func ServiceIPsKey(prefix string) string { return key(prefix, ServiceIPsPath) }

// SecondaryServiceIPsKey returns the key of the secondary IP family's bitmap for prefix, as
// ServiceIPsKey does for the primary one: "/registry/ranges/secondaryserviceips" by default.
func SecondaryServiceIPsKey(prefix string) string { return key(prefix, SecondaryServiceIPsPath) }

// KeyFor returns the key of the bitmap of the range at index i of kube-apiserver's
// --service-cluster-ip-range (and of clusterip.Config.Ranges) for prefix: ServiceIPsKey for the
// primary range (i == 0), SecondaryServiceIPsKey for the secondary one. Any other i is taken as
// the secondary range, the only other one a flag holds.
func KeyFor(prefix string, i int) string {
	if i == 0 {
		return ServiceIPsKey(prefix)
	}
	return SecondaryServiceIPsKey(prefix)
}

// Stores are the bitmap stores of a kube-apiserver: the keys KeyFor gives for Prefix in the etcd
// Client reaches, in the storage encoding New writes. Give one to clusterip.Config.Bitmaps for
// Legacy and DualWrite mode:
//
//	cfg.Bitmaps = etcdstore.Stores{Client: etcd, Prefix: "/registry"}
//
// The zero Stores, or one with a nil Client, gives invalid Stores (see New). A Stores is a small
// value, safe for concurrent use; it does not own Client, which stays the caller's to close.
type Stores struct {
	// Client reaches the etcd kube-apiserver stores its objects in.
	Client *clientv3.Client
	// Prefix is kube-apiserver's --etcd-prefix. Defaults to DefaultPrefix, "/registry".
	Prefix string
}

var _ bitmap.Stores = Stores{}

// Store returns the Store of the bitmap of the range at index i of --service-cluster-ip-range:
// New(s.Client, KeyFor(s.Prefix, i)).
func (s Stores) Store(i int) bitmap.Store { return New(s.Client, KeyFor(s.Prefix, i)) }

func key(prefix, p string) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return path.Join("/", prefix, p)
}

// Format is the encoding Store writes values in. Both are always read.
type Format int

const (
	// Protobuf is kube-apiserver's default storage encoding: "k8s\x00" followed by a protobuf
	// runtime.Unknown holding apiVersion v1, kind RangeAllocation and the protobuf object.
	Protobuf Format = iota
	// JSON is the encoding of kube-apiserver started with --storage-media-type=application/json.
	JSON
)

// String returns "protobuf" or "json".
func (f Format) String() string {
	switch f {
	case Protobuf:
		return "protobuf"
	case JSON:
		return "json"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

var (
	scheme   = runtime.NewScheme()
	codecs   serializer.CodecFactory
	decoder  runtime.Decoder
	encoders map[Format]runtime.Encoder
)

func init() {
	if err := corev1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	codecs = serializer.NewCodecFactory(scheme)
	decoder = codecs.UniversalDeserializer()
	encoders = make(map[Format]runtime.Encoder)
	for f, mediaType := range map[Format]string{Protobuf: runtime.ContentTypeProtobuf, JSON: runtime.ContentTypeJSON} {
		info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), mediaType)
		if !ok {
			panic("etcdstore: no serializer for " + mediaType)
		}
		// Set apiVersion and kind from the scheme, without conversion: v1 is the storage version.
		encoders[f] = codecs.WithoutConversion().EncoderForVersion(info.Serializer, corev1.SchemeGroupVersion)
	}
}

// Encode returns s as a core/v1 RangeAllocation in format f, as kube-apiserver would store it:
// empty metadata, Range and Data. It fails only for an unknown format.
func Encode(s bitmap.Snapshot, f Format) ([]byte, error) {
	enc, ok := encoders[f]
	if !ok {
		return nil, fmt.Errorf("etcdstore: unknown format %v", f)
	}
	data := s.Data
	if data == nil {
		data = []byte{} // kube-apiserver writes the empty bytes of big.Int(0), not a missing field
	}
	obj := &corev1.RangeAllocation{Range: s.Range, Data: data}
	var buf bytes.Buffer
	if err := enc.Encode(obj, &buf); err != nil {
		return nil, fmt.Errorf("etcdstore: encode RangeAllocation: %w", err)
	}
	return buf.Bytes(), nil
}

// Decode returns the snapshot held by a stored core/v1 RangeAllocation in either format. A value
// that does not decode, or that holds another kind of object, returns an error wrapping
// bitmap.ErrCorrupt.
func Decode(value []byte) (bitmap.Snapshot, error) {
	obj, gvk, err := decoder.Decode(value, nil, nil)
	if err != nil {
		return bitmap.Snapshot{}, fmt.Errorf("%w: not a RangeAllocation: %v", bitmap.ErrCorrupt, err)
	}
	ra, ok := obj.(*corev1.RangeAllocation)
	if !ok {
		return bitmap.Snapshot{}, fmt.Errorf("%w: holds %s, not a v1 RangeAllocation", bitmap.ErrCorrupt, gvk)
	}
	return bitmap.Snapshot{Range: ra.Range, Data: ra.Data}, nil
}

// ErrInvalidStore is returned, wrapped, by every method of a Store built with a nil client, an
// empty key or a nil Option, and of the zero Store. It matches allocator.ErrInvalid.
var ErrInvalidStore = fmt.Errorf("%w: etcdstore: invalid Store", allocator.ErrInvalid)

// Option configures a Store.
type Option func(*Store)

// WithFormat sets the encoding Store writes; values in either encoding are read. Default
// Protobuf, kube-apiserver's default; JSON writes as kube-apiserver does with
// --storage-media-type=application/json; an unknown format keeps the default.
func WithFormat(f Format) Option {
	return func(s *Store) {
		if _, ok := encoders[f]; ok {
			s.format = f
		}
	}
}

var _ bitmap.Store = (*Store)(nil)

// Store is a bitmap.Store kept at one etcd key. Its revisions are the key's ModRevision.
//
// A Store is safe for concurrent use. The zero Store, like one built from a nil client, an empty
// key or a nil Option, is invalid: its methods return an error wrapping ErrInvalidStore (so
// bitmap.NewPersistent fails on it at construction) and never panic. It holds no resources of its
// own: the client stays the caller's to close.
type Store struct {
	client *clientv3.Client
	key    string
	format Format
	err    error // why the Store is invalid, if it is: its methods return it
}

// New returns a Store that keeps its snapshot at key, such as ServiceIPsKey(""), using client.
// New does not fail; if client is nil, key is empty or an Option is nil, the Store's methods
// return an error wrapping ErrInvalidStore that says which.
func New(client *clientv3.Client, key string, opts ...Option) *Store {
	s := &Store{client: client, key: key}
	switch {
	case client == nil:
		s.err = fmt.Errorf("%w: nil etcd client (key %q)", ErrInvalidStore, key)
	case key == "":
		s.err = fmt.Errorf("%w: empty key", ErrInvalidStore)
	}
	for i, opt := range opts {
		if opt == nil {
			if s.err == nil {
				s.err = fmt.Errorf("%w: option %d is nil", ErrInvalidStore, i)
			}
			continue
		}
		opt(s)
	}
	return s
}

// check returns why s is unusable, or nil.
func (s *Store) check() error {
	switch {
	case s == nil:
		return fmt.Errorf("%w: nil *Store", ErrInvalidStore)
	case s.err != nil:
		return s.err
	case s.client == nil:
		return fmt.Errorf("%w: the zero Store; create one with New", ErrInvalidStore)
	}
	return nil
}

// Key returns the etcd key of s.
func (s *Store) Key() string {
	if s == nil {
		return ""
	}
	return s.key
}

// Format returns the encoding s writes.
func (s *Store) Format() Format {
	if s == nil {
		return Protobuf
	}
	return s.format
}

// Get returns the stored snapshot and the key's ModRevision, or the zero Snapshot and 0 if the key
// does not exist. A value that is not a RangeAllocation returns an error wrapping
// bitmap.ErrCorrupt; etcd errors are wrapped; an invalid Store returns ErrInvalidStore.
func (s *Store) Get(ctx context.Context) (bitmap.Snapshot, int64, error) {
	if err := s.check(); err != nil {
		return bitmap.Snapshot{}, 0, err
	}
	resp, err := s.client.Get(ctx, s.key)
	if err != nil {
		return bitmap.Snapshot{}, 0, fmt.Errorf("etcdstore: get %s: %w", s.key, err)
	}
	if len(resp.Kvs) == 0 {
		return bitmap.Snapshot{}, 0, nil
	}
	kv := resp.Kvs[0]
	snap, err := Decode(kv.Value)
	if err != nil {
		return bitmap.Snapshot{}, 0, fmt.Errorf("etcdstore: %s at revision %d: %w", s.key, kv.ModRevision, err)
	}
	return snap, kv.ModRevision, nil
}

// Update writes snap if the key's ModRevision is still rev (rev 0: only if the key does not exist)
// and returns the new ModRevision, in one etcd transaction. If the key has moved on it returns an
// error wrapping a *bitmap.ConflictError carrying the stored snapshot (or wrapping plain
// bitmap.ErrConflict if that does not decode) and writes nothing. A snapshot of an IPv4 range
// wider than kube-apiserver's cap (see bitmap.CheckStorable) returns an *allocator.PrefixError and
// is not sent. Other errors are etcd's, wrapped; after one of those the write may or may not have
// happened.
func (s *Store) Update(ctx context.Context, rev int64, snap bitmap.Snapshot) (int64, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	if p, err := netip.ParsePrefix(snap.Range); err == nil {
		if err := bitmap.CheckStorable(p); err != nil {
			return 0, fmt.Errorf("etcdstore: update %s: %w", s.key, err)
		}
	}
	value, err := Encode(snap, s.format)
	if err != nil {
		return 0, err
	}
	resp, err := s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(s.key), "=", rev)).
		Then(clientv3.OpPut(s.key, string(value))).
		Else(clientv3.OpGet(s.key)).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("etcdstore: update %s: %w", s.key, err)
	}
	if resp.Succeeded {
		return resp.Header.Revision, nil
	}
	return 0, s.conflict(resp, rev)
}

var _ bitmap.Deleter = (*Store)(nil)

// Delete removes the key if its ModRevision is still rev, in one etcd transaction (rev 0: only if
// the key does not exist, which changes nothing). If the key has moved on, written or deleted
// since, it returns an error wrapping a *bitmap.ConflictError carrying what is stored now (Rev 0
// if nothing is; plain bitmap.ErrConflict if the value does not decode) and deletes nothing.
// Other errors are etcd's, wrapped; after one of those the delete may or may not have happened.
// An invalid Store returns ErrInvalidStore.
func (s *Store) Delete(ctx context.Context, rev int64) error {
	if err := s.check(); err != nil {
		return err
	}
	resp, err := s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(s.key), "=", rev)).
		Then(clientv3.OpDelete(s.key)).
		Else(clientv3.OpGet(s.key)).
		Commit()
	if err != nil {
		return fmt.Errorf("etcdstore: delete %s: %w", s.key, err)
	}
	if resp.Succeeded {
		return nil
	}
	return s.conflict(resp, rev)
}

// conflict returns the error of a transaction on s's key that failed its comparison with rev:
// one wrapping a *bitmap.ConflictError with what its Else branch, a Get of the key, read.
func (s *Store) conflict(resp *clientv3.TxnResponse, rev int64) error {
	var kvs []*mvccpb.KeyValue
	if len(resp.Responses) > 0 {
		if rr := resp.Responses[0].GetResponseRange(); rr != nil {
			kvs = rr.Kvs
		}
	}
	if len(kvs) == 0 {
		return fmt.Errorf("etcdstore: %s: %w", s.key, &bitmap.ConflictError{})
	}
	cur, derr := Decode(kvs[0].Value)
	if derr != nil {
		return fmt.Errorf("etcdstore: %s changed since revision %d: %w", s.key, rev, bitmap.ErrConflict)
	}
	return fmt.Errorf("etcdstore: %s: %w", s.key, &bitmap.ConflictError{Current: cur, Rev: kvs[0].ModRevision})
}
