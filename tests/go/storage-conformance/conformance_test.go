// Package conformance runs kube-apiserver's shared storage test suites
// (k8s.io/apiserver/pkg/storage/testing, the RunTest* functions its etcd3
// store tests run) against the etcd3 storage.Interface of k8s.io/apiserver
// pointed at an external store: ephd or, as control, stock etcd.
//
// The store's client endpoints come from EPHD_STORE_ENDPOINTS
// (comma-separated); tests/it/storage_conformance.rs starts the servers and
// runs this test binary (built by scripts/install-references.sh).
//
// Like the etcd3 store's own tests, each test expects a server of its own
// (fresh history, nothing compacted): the runner starts one per test and
// picks the test with -test.run. EPHD_STORE_PREFIX, when set, is the key
// prefix the storage factory is given (empty by default, as in etcd3's tests).
package conformance

import (
	"context"
	"os"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/utils/clock"

	"k8s.io/apimachinery/pkg/api/apitesting"
)

var scheme = runtime.NewScheme()
var codecs = serializer.NewCodecFactory(scheme)

// storedPrefix is what the tests' transformer puts before every stored
// value (the suites check and modify it).
const storedPrefix = "conformance!"

func init() {
	metav1.AddToGroupVersion(scheme, metav1.SchemeGroupVersion)
	utilruntime.Must(example.AddToScheme(scheme))
	utilruntime.Must(examplev1.AddToScheme(scheme))
}

// swappableTransformer lets a suite replace the prefix transformer that the
// store and its watcher both use.
type swappableTransformer struct {
	mu      sync.RWMutex
	current value.Transformer
}

func (s *swappableTransformer) get() value.Transformer {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.current
}

func (s *swappableTransformer) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, bool, error) {
	return s.get().TransformFromStorage(ctx, data, dataCtx)
}

func (s *swappableTransformer) TransformToStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, error) {
	return s.get().TransformToStorage(ctx, data, dataCtx)
}

// storeUnderTest is the etcd3 store with its swappable transformer, which
// makes it an InterfaceWithPrefixTransformer.
type storeUnderTest struct {
	storage.Interface
	transformer *swappableTransformer
	// keyPrefix is what the store puts before every key the suites name.
	keyPrefix string
}

func (s *storeUnderTest) UpdatePrefixTransformer(modifier storagetesting.PrefixTransformerModifier) func() {
	s.transformer.mu.Lock()
	defer s.transformer.mu.Unlock()
	original := s.transformer.current
	changed := *original.(*storagetesting.PrefixTransformer)
	s.transformer.current = modifier(&changed)
	return func() {
		s.transformer.mu.Lock()
		defer s.transformer.mu.Unlock()
		s.transformer.current = original
	}
}

func endpoints(t testing.TB) []string {
	raw := os.Getenv("EPHD_STORE_ENDPOINTS")
	if raw == "" {
		t.Fatal("EPHD_STORE_ENDPOINTS is not set: run this through tests/it/storage_conformance.rs")
	}
	return strings.Split(raw, ",")
}

func newClient(t testing.TB) *kubernetes.Client {
	client, err := kubernetes.New(clientv3.Config{
		Endpoints:   endpoints(t),
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	client.KV = storagetesting.NewKVRecorder(client.KV)
	client.Kubernetes = storagetesting.NewKubernetesRecorder(client.Kubernetes)
	return client
}

// setup builds the store as the apiserver's storage factory does, for
// example.Pods, with a prefix transformer the suites can swap.
func setup(t *testing.T) (context.Context, *storeUnderTest, *kubernetes.Client) {
	client := newClient(t)
	transformer := &swappableTransformer{
		current: storagetesting.NewPrefixTransformer([]byte(storedPrefix), false),
	}
	leases := etcd3.NewDefaultLeaseManagerConfig()
	leases.ReuseDurationSeconds = 1
	s := newEtcd3Store(t, client, storePrefix(), transformer, leases)
	return context.Background(), &storeUnderTest{Interface: s, transformer: transformer, keyPrefix: storePrefix()}, client
}

// storePrefix is the key prefix the storage factory is given.
func storePrefix() string { return os.Getenv("EPHD_STORE_PREFIX") }

// newEtcd3Store is the apiserver's etcd3 storage.Interface for example.Pods
// under prefix + "/pods/", on client.
func newEtcd3Store(t testing.TB, client *kubernetes.Client, prefix string, transformer value.Transformer, leases etcd3.LeaseManagerConfig) storage.Interface {
	codec := apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion)
	versioner := storage.APIObjectVersioner{}
	compactor := etcd3.NewCompactor(client.Client, 0, clock.RealClock{}, nil)
	t.Cleanup(compactor.Stop)
	s, err := etcd3.New(client, compactor, codec,
		func() runtime.Object { return &example.Pod{} },
		func() runtime.Object { return &example.PodList{} },
		prefix, "/pods/", schema.GroupResource{Resource: "pods"},
		transformer, leases, etcd3.NewDefaultDecoder(codec, versioner), versioner)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// compaction compacts the store's whole history up to a resource version,
// through the apiserver's own compaction transaction.
func compaction(s storage.Interface, client *clientv3.Client) storagetesting.Compaction {
	return func(ctx context.Context, t *testing.T, resourceVersion string) {
		rv, err := storage.APIObjectVersioner{}.ParseResourceVersion(resourceVersion)
		if err != nil {
			t.Fatal(err)
		}
		// The compaction transaction succeeds only when it names the
		// current version of compact_rev_key, which earlier tests moved on;
		// a failed one answers that version.
		version := int64(0)
		for attempt := 0; ; attempt++ {
			next, _, compacted, err := etcd3.Compact(ctx, client, version, int64(rv))
			if err != nil {
				t.Fatal(err)
			}
			if compacted == int64(rv) {
				break
			}
			if attempt == 5 {
				t.Fatalf("compacting to %d: compact_rev_key is at %d", rv, compacted)
			}
			version = next
		}
		observer, ok := s.(interface{ CompactRevision() int64 })
		if !ok || !utilfeature.DefaultFeatureGate.Enabled(features.ListFromCacheSnapshot) {
			return
		}
		deadline := time.Now().Add(30 * time.Second)
		for observer.CompactRevision() < int64(rv) {
			if time.Now().After(deadline) {
				t.Fatalf("the store never observed compaction to %d (it saw %d)", rv, observer.CompactRevision())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// increaseRV writes a key outside every test's prefix and returns the
// revision it got.
func increaseRV(client *clientv3.Client) storagetesting.IncreaseRVFunc {
	return func(ctx context.Context, t *testing.T) int64 {
		resp, err := client.KV.Put(ctx, "/conformance-increase-rv", "ok")
		if err != nil {
			t.Fatalf("put: %v", err)
		}
		return resp.Header.Revision
	}
}

// storedKeys lists the keys the store holds, as the apiserver's size
// estimation asks for them.
func storedKeys(s *storeUnderTest, client *clientv3.Client) storage.KeysFunc {
	return func(ctx context.Context) ([]string, error) {
		resp, err := client.KV.Get(ctx, path.Join("/", s.keyPrefix, "pods")+"/",
			clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return nil, err
		}
		keys := make([]string, 0, len(resp.Kvs))
		for _, kv := range resp.Kvs {
			keys = append(keys, string(kv.Key))
		}
		return keys, nil
	}
}

// storedWithoutVersion checks what the store wrote under a key: the object
// decodes, and its resource version and self link are not stored.
func storedWithoutVersion(s *storeUnderTest, client *clientv3.Client) storagetesting.KeyValidation {
	codec := apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion)
	return func(ctx context.Context, t *testing.T, key string) {
		key = s.keyPrefix + key
		resp, err := client.KV.Get(ctx, key)
		if err != nil {
			t.Fatalf("get %s: %v", key, err)
		}
		if len(resp.Kvs) == 0 {
			t.Fatalf("nothing stored under %s", key)
		}
		stored := resp.Kvs[0].Value
		if !strings.HasPrefix(string(stored), storedPrefix) {
			t.Fatalf("stored value lacks the transformer's prefix: %q", stored)
		}
		decoded, err := runtime.Decode(codec, stored[len(storedPrefix):])
		if err != nil {
			t.Fatalf("decode %s: %v", key, err)
		}
		pod := decoded.(*example.Pod)
		if pod.ResourceVersion != "" || pod.SelfLink != "" {
			t.Errorf("stored object carries resource version %q / self link %q", pod.ResourceVersion, pod.SelfLink)
		}
	}
}
