package conformance

// The watch cache (k8s.io/apiserver/pkg/storage/cacher) on top of the
// external store: the shared suites that the cacher's own tests run, on a
// Cacher and CacheDelegator built through the package's exported API in
// the way those tests build theirs (one injected list error, so that the
// reflector relists once; the cache waited for before the suite starts).
//
// Not run, with the reason: the cacher tests that read or change the
// watch cache's private state, which only code inside the package can
// reach (TestMarkConsistent counts its snapshots; TestWatchFromZero
// compacts the cache's event window by moving its private indexes, which
// no exported call does), and the ones the cacher's own tests leave empty
// (GuaranteedUpdate, GuaranteedUpdateChecksStoredData,
// TransformationFailure, WatchError, WatchContextCancel,
// ListInconsistentContinuation, ListResourceVersionMatch).

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/kubernetes"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/cacher"
	"k8s.io/apiserver/pkg/storage/etcd3"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/tools/cache"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/utils/clock"
)

// cacheOptions are what differs between the cacher tests' setups.
type cacheOptions struct {
	clusterScoped bool
	indexed       bool
}

// podFields are the fields a pod can be selected by, as the apiserver's
// pod registry exposes them.
func podFields(pod *example.Pod) fields.Set {
	return fields.Set{
		"metadata.name":      pod.Name,
		"metadata.namespace": pod.Namespace,
		"spec.nodeName":      pod.Spec.NodeName,
		"spec.restartPolicy": string(pod.Spec.RestartPolicy),
		"status.phase":       string(pod.Status.Phase),
	}
}

func podAttributes(obj runtime.Object) (labels.Set, fields.Set, error) {
	pod, ok := obj.(*example.Pod)
	if !ok {
		return nil, nil, fmt.Errorf("%T is not a pod", obj)
	}
	return labels.Set(pod.Labels), podFields(pod), nil
}

// setupCache builds the etcd3 store, a Cacher over it and the
// CacheDelegator that serves reads from the cache.
func setupCache(t *testing.T, options cacheOptions) (context.Context, *cacher.CacheDelegator, *kubernetes.Client) {
	client := newClient(t)
	// The list suites expect the cacher tests' key prefix in the
	// requests they record.
	store := newEtcd3Store(t, client, "/registry", identity.NewEncryptCheckTransformer(), etcd3.NewDefaultLeaseManagerConfig())

	// One failed list makes the reflector relist, as in the cacher's tests
	// (with WatchListClient the reflector watches instead of listing).
	listErrors := 1
	if clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient) {
		listErrors = 0
	}
	failing := &storagetesting.StorageInjectingListErrors{Interface: store, Errors: listErrors}

	resourcePrefix := "/pods/"
	keyFunc := func(obj runtime.Object) (string, error) { return storage.NamespaceKeyFunc(resourcePrefix, obj) }
	if options.clusterScoped {
		keyFunc = func(obj runtime.Object) (string, error) { return storage.NoNamespaceKeyFunc(resourcePrefix, obj) }
	}
	var indexerFuncs map[string]storage.IndexerFunc
	indexers := cache.Indexers{}
	if options.indexed {
		indexerFuncs = map[string]storage.IndexerFunc{
			"spec.nodeName": func(obj runtime.Object) string {
				if pod, ok := obj.(*example.Pod); ok {
					return pod.Spec.NodeName
				}
				return ""
			},
		}
		indexers = cache.Indexers{
			"f:spec.nodeName":      func(obj interface{}) ([]string, error) { return []string{obj.(*example.Pod).Spec.NodeName}, nil },
			"f:metadata.namespace": func(obj interface{}) ([]string, error) { return []string{obj.(*example.Pod).Namespace}, nil },
		}
	}
	watchCache, err := cacher.NewCacherFromConfig(cacher.Config{
		Storage:             failing,
		Versioner:           storage.APIObjectVersioner{},
		GroupResource:       schema.GroupResource{Resource: "pods"},
		EventsHistoryWindow: cacher.DefaultEventFreshDuration,
		ResourcePrefix:      resourcePrefix,
		KeyFunc:             keyFunc,
		GetAttrsFunc:        podAttributes,
		NewFunc:             func() runtime.Object { return &example.Pod{} },
		NewListFunc:         func() runtime.Object { return &example.PodList{} },
		IndexerFuncs:        indexerFuncs,
		Indexers:            &indexers,
		Codec:               codecs.LegacyCodec(examplev1.SchemeGroupVersion),
		Clock:               clock.RealClock{},
	})
	if err != nil {
		t.Fatalf("cacher: %v", err)
	}
	t.Cleanup(watchCache.Stop)
	ctx := context.Background()
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true,
		func(context.Context) (bool, error) { return failing.ErrorsConsumed() }); err != nil {
		t.Fatalf("the cache never listed: %v", err)
	}
	// The suites expect reads and watches not to be refused while the
	// cache initializes.
	if err := watchCache.Wait(ctx); err != nil {
		t.Fatalf("the cache never became ready: %v", err)
	}
	delegator := cacher.NewCacheDelegator(watchCache, failing)
	t.Cleanup(delegator.Stop)
	return ctx, delegator, client
}

// createVisibleInCache waits, after each Create, until the cache serves
// the object that was created (the watch semantics suites expect it).
type createVisibleInCache struct {
	*cacher.CacheDelegator
}

func (c createVisibleInCache) Create(ctx context.Context, key string, obj, out runtime.Object, ttl uint64) error {
	if err := c.CacheDelegator.Create(ctx, key, obj, out, ttl); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		cached := &example.Pod{}
		err := c.CacheDelegator.Get(ctx, key, storage.GetOptions{ResourceVersion: "0"}, cached)
		if storage.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		return equality.Semantic.DeepEqual(cached, out), nil
	})
}

func noStorageCheck(context.Context, *testing.T, string) {}

func noCallCheck(*testing.T, uint64, uint64) {}

func TestCacherCreate(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestCreate(ctx, t, s, noStorageCheck)
}

func TestCacherCreateWithTTL(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestCreateWithTTL(ctx, t, s)
}

func TestCacherCreateWithKeyExist(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestCreateWithKeyExist(ctx, t, s)
}

func TestCacherGet(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestGet(ctx, t, s)
}

func TestCacherUnconditionalDelete(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestUnconditionalDelete(ctx, t, s)
}

func TestCacherConditionalDelete(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestConditionalDelete(ctx, t, s)
}

func TestCacherDeleteWithSuggestion(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestDeleteWithSuggestion(ctx, t, s)
}

func TestCacherDeleteWithSuggestionAndConflict(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestDeleteWithSuggestionAndConflict(ctx, t, s)
}

func TestCacherDeleteWithSuggestionOfDeletedObject(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestDeleteWithSuggestionOfDeletedObject(ctx, t, s)
}

func TestCacherValidateDeletionWithSuggestion(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestValidateDeletionWithSuggestion(ctx, t, s)
}

func TestCacherValidateDeletionWithOnlySuggestionValid(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestValidateDeletionWithOnlySuggestionValid(ctx, t, s)
}

func TestCacherDeleteWithConflict(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestDeleteWithConflict(ctx, t, s)
}

func TestCacherPreconditionalDeleteWithSuggestion(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestPreconditionalDeleteWithSuggestion(ctx, t, s)
}

func TestCacherPreconditionalDeleteWithOnlySuggestionPass(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestPreconditionalDeleteWithOnlySuggestionPass(ctx, t, s)
}

func TestCacherListPaging(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestListPaging(ctx, t, s)
}

// listFeatures sets the two features the list suites run under: whether
// consistent lists are served from the cache, and whether lists at older
// resource versions are served from the cache's snapshots.
func listFeatures(t *testing.T, consistentFromCache, fromSnapshot bool) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ListFromCacheSnapshot, fromSnapshot)
	if !consistentFromCache {
		featuregatetesting.SetFeatureGateEmulationVersionDuringTest(t, utilfeature.DefaultFeatureGate, version.MustParse("1.33"))
		featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ConsistentListFromCache, false)
	}
}

func runList(t *testing.T, consistentFromCache, fromSnapshot bool) {
	listFeatures(t, consistentFromCache, fromSnapshot)
	ctx, s, c := setupCache(t, cacheOptions{})
	recorder := c.Kubernetes.(*storagetesting.KubernetesRecorder)
	storagetesting.RunTestList(ctx, t, s, compaction(s, c.Client), true, recorder)
}

func runConsistentList(t *testing.T, consistentFromCache, fromSnapshot bool) {
	listFeatures(t, consistentFromCache, fromSnapshot)
	ctx, s, c := setupCache(t, cacheOptions{})
	storagetesting.RunTestConsistentList(ctx, t, s, increaseRV(c.Client), true, consistentFromCache, fromSnapshot)
}

func runGetListNonRecursive(t *testing.T, consistentFromCache, fromSnapshot bool) {
	listFeatures(t, consistentFromCache, fromSnapshot)
	ctx, s, c := setupCache(t, cacheOptions{})
	storagetesting.RunTestGetListNonRecursive(ctx, t, increaseRV(c.Client), s)
}

// The list suites under each combination of the two features, each a test
// of its own so that each gets a fresh server.

func TestCacherListConsistentFromCacheWithSnapshots(t *testing.T) { runList(t, true, true) }
func TestCacherListConsistentFromCache(t *testing.T)              { runList(t, true, false) }
func TestCacherListWithSnapshots(t *testing.T)                    { runList(t, false, true) }
func TestCacherListFromStore(t *testing.T)                        { runList(t, false, false) }

func TestCacherConsistentListConsistentFromCacheWithSnapshots(t *testing.T) {
	runConsistentList(t, true, true)
}
func TestCacherConsistentListConsistentFromCache(t *testing.T) { runConsistentList(t, true, false) }
func TestCacherConsistentListWithSnapshots(t *testing.T)       { runConsistentList(t, false, true) }
func TestCacherConsistentListFromStore(t *testing.T)           { runConsistentList(t, false, false) }

func TestCacherGetListNonRecursiveConsistentFromCacheWithSnapshots(t *testing.T) {
	runGetListNonRecursive(t, true, true)
}
func TestCacherGetListNonRecursiveConsistentFromCache(t *testing.T) {
	runGetListNonRecursive(t, true, false)
}
func TestCacherGetListNonRecursiveWithSnapshots(t *testing.T) { runGetListNonRecursive(t, false, true) }
func TestCacherGetListNonRecursiveFromStore(t *testing.T)     { runGetListNonRecursive(t, false, false) }

func TestCacherCompactRevision(t *testing.T) {
	// The cache learns of compactions through the store's watch on the
	// compaction key, which comes with ListFromCacheSnapshot.
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ListFromCacheSnapshot, true)
	ctx, s, c := setupCache(t, cacheOptions{})
	storagetesting.RunTestCompactRevision(ctx, t, s, increaseRV(c.Client), compaction(s, c.Client))
}

func TestCacherGetListRecursivePrefix(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestGetListRecursivePrefix(ctx, t, s)
}

func TestCacherListContinuation(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestListContinuation(ctx, t, s, noCallCheck)
}

func TestCacherListPaginationRareObject(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestListPaginationRareObject(ctx, t, s, noCallCheck)
}

func TestCacherListContinuationWithFilter(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestListContinuationWithFilter(ctx, t, s, noCallCheck)
}

func TestCacherNamespaceScopedList(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{indexed: true})
	storagetesting.RunTestNamespaceScopedList(ctx, t, s)
}

func TestCacherGuaranteedUpdateWithTTL(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestGuaranteedUpdateWithTTL(ctx, t, s)
}

func TestCacherGuaranteedUpdateWithConflict(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestGuaranteedUpdateWithConflict(ctx, t, s)
}

func TestCacherGuaranteedUpdateWithSuggestionAndConflict(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestGuaranteedUpdateWithSuggestionAndConflict(ctx, t, s)
}

func TestCacherStats(t *testing.T) {
	for _, sizeBased := range []bool{true, false} {
		t.Run(fmt.Sprintf("SizeBasedListCostEstimate=%v", sizeBased), func(t *testing.T) {
			featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.SizeBasedListCostEstimate, sizeBased)
			ctx, s, _ := setupCache(t, cacheOptions{})
			storagetesting.RunTestStats(ctx, t, s, codecs.LegacyCodec(examplev1.SchemeGroupVersion), identity.NewEncryptCheckTransformer(), sizeBased)
		})
	}
}

func TestCacherKeySchema(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestKeySchema(ctx, t, s)
}

func TestCacherWatch(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestWatch(ctx, t, s)
}

func TestCacherDeleteTriggerWatch(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestDeleteTriggerWatch(ctx, t, s)
}

func TestCacherWatchFromNonZero(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestWatchFromNonZero(ctx, t, s)
}

func TestCacherDelayedWatchDelivery(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestDelayedWatchDelivery(ctx, t, s)
}

func TestCacherWatcherTimeout(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestWatcherTimeout(ctx, t, s)
}

func TestCacherWatchDeleteEventObjectHaveLatestRV(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestWatchDeleteEventObjectHaveLatestRV(ctx, t, s)
}

func TestCacherWatchInitializationSignal(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestWatchInitializationSignal(ctx, t, s)
}

func TestCacherClusterScopedWatch(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{clusterScoped: true, indexed: true})
	storagetesting.RunTestClusterScopedWatch(ctx, t, s)
}

func TestCacherNamespaceScopedWatch(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{indexed: true})
	storagetesting.RunTestNamespaceScopedWatch(ctx, t, s)
}

func TestCacherWatchDispatchBookmarkEvents(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestWatchDispatchBookmarkEvents(ctx, t, s, true)
}

func TestCacherWatchBookmarksWithCorrectResourceVersion(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunTestOptionalWatchBookmarksWithCorrectResourceVersion(ctx, t, s)
}

func TestCacherSendInitialEventsBackwardCompatibility(t *testing.T) {
	ctx, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunSendInitialEventsBackwardCompatibility(ctx, t, s)
}

func TestCacherWatchSemantics(t *testing.T) {
	_, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunWatchSemantics(context.Background(), t, createVisibleInCache{s})
}

func TestCacherWatchSemanticInitialEventsExtended(t *testing.T) {
	_, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunWatchSemanticInitialEventsExtended(context.Background(), t, createVisibleInCache{s})
}

func TestCacherWatchListMatchSingle(t *testing.T) {
	_, s, _ := setupCache(t, cacheOptions{})
	storagetesting.RunWatchListMatchSingle(context.Background(), t, createVisibleInCache{s})
}
