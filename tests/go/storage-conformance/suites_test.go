package conformance

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/apitesting"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/features"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
)

// The store suites, with the arguments the etcd3 store's own tests pass
// (no watch cache, consistent reads supported).

func TestCreate(t *testing.T) {
	ctx, s, c := setup(t)
	storagetesting.RunTestCreate(ctx, t, s, storedWithoutVersion(s, c.Client))
}

func TestCreateWithTTL(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestCreateWithTTL(ctx, t, s)
}

func TestCreateWithKeyExist(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestCreateWithKeyExist(ctx, t, s)
}

func TestGet(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestGet(ctx, t, s)
}

func TestUnconditionalDelete(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestUnconditionalDelete(ctx, t, s)
}

func TestConditionalDelete(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestConditionalDelete(ctx, t, s)
}

func TestDeleteWithSuggestion(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestDeleteWithSuggestion(ctx, t, s)
}

func TestDeleteWithSuggestionAndConflict(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestDeleteWithSuggestionAndConflict(ctx, t, s)
}

func TestDeleteWithConflict(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestDeleteWithConflict(ctx, t, s)
}

func TestDeleteWithSuggestionOfDeletedObject(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestDeleteWithSuggestionOfDeletedObject(ctx, t, s)
}

func TestValidateDeletionWithSuggestion(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestValidateDeletionWithSuggestion(ctx, t, s)
}

func TestValidateDeletionWithOnlySuggestionValid(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestValidateDeletionWithOnlySuggestionValid(ctx, t, s)
}

func TestPreconditionalDeleteWithSuggestion(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestPreconditionalDeleteWithSuggestion(ctx, t, s)
}

func TestPreconditionalDeleteWithOnlySuggestionPass(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestPreconditionalDeleteWithOnlySuggestionPass(ctx, t, s)
}

func TestList(t *testing.T) {
	ctx, s, c := setup(t)
	recorder := c.Kubernetes.(*storagetesting.KubernetesRecorder)
	storagetesting.RunTestList(ctx, t, s, compaction(s, c.Client), false, recorder)
}

func TestConsistentList(t *testing.T) {
	ctx, s, c := setup(t)
	storagetesting.RunTestConsistentList(ctx, t, s, increaseRV(c.Client), false, true, false)
}

func TestGetListNonRecursive(t *testing.T) {
	ctx, s, c := setup(t)
	storagetesting.RunTestGetListNonRecursive(ctx, t, increaseRV(c.Client), s)
}

func TestGetListRecursivePrefix(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestGetListRecursivePrefix(ctx, t, s)
}

func TestListContinuation(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestListContinuation(ctx, t, s, nil)
}

func TestListPaginationRareObject(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestListPaginationRareObject(ctx, t, s, nil)
}

func TestListContinuationWithFilter(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestListContinuationWithFilter(ctx, t, s, nil)
}

func TestListInconsistentContinuation(t *testing.T) {
	ctx, s, c := setup(t)
	storagetesting.RunTestListInconsistentContinuation(ctx, t, s, compaction(s, c.Client))
}

func TestListResourceVersionMatch(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestListResourceVersionMatch(ctx, t, s)
}

func TestGuaranteedUpdate(t *testing.T) {
	ctx, s, c := setup(t)
	storagetesting.RunTestGuaranteedUpdate(ctx, t, s, storedWithoutVersion(s, c.Client))
}

func TestGuaranteedUpdateWithTTL(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestGuaranteedUpdateWithTTL(ctx, t, s)
}

func TestGuaranteedUpdateChecksStoredData(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestGuaranteedUpdateChecksStoredData(ctx, t, s)
}

func TestGuaranteedUpdateWithConflict(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestGuaranteedUpdateWithConflict(ctx, t, s)
}

func TestGuaranteedUpdateWithSuggestionAndConflict(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestGuaranteedUpdateWithSuggestionAndConflict(ctx, t, s)
}

func TestTransformationFailure(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestTransformationFailure(ctx, t, s)
}

func TestStats(t *testing.T) {
	for _, sizeBased := range []bool{true, false} {
		t.Run(map[bool]string{true: "size-based", false: "count-based"}[sizeBased], func(t *testing.T) {
			ctx, s, c := setup(t)
			if sizeBased {
				if err := s.EnableResourceSizeEstimation(storedKeys(s, c.Client)); err != nil {
					t.Fatal(err)
				}
			}
			codec := apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion)
			storagetesting.RunTestStats(ctx, t, s, codec, s.transformer, sizeBased)
		})
	}
}

func TestListPaging(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestListPaging(ctx, t, s)
}

func TestNamespaceScopedList(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestNamespaceScopedList(ctx, t, s)
}

func TestCompactRevision(t *testing.T) {
	// The store observes compactions made by others only through its watch
	// of compact_rev_key, which ListFromCacheSnapshot turns on.
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ListFromCacheSnapshot, true)
	ctx, s, c := setup(t)
	storagetesting.RunTestCompactRevision(ctx, t, s, increaseRV(c.Client), compaction(s, c.Client))
}

func TestKeySchema(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestKeySchema(ctx, t, s)
}

// The watch suites.

func TestWatch(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestWatch(ctx, t, s)
}

func TestClusterScopedWatch(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestClusterScopedWatch(ctx, t, s)
}

func TestNamespaceScopedWatch(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestNamespaceScopedWatch(ctx, t, s)
}

func TestDeleteTriggerWatch(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestDeleteTriggerWatch(ctx, t, s)
}

func TestWatchFromZero(t *testing.T) {
	ctx, s, c := setup(t)
	storagetesting.RunTestWatchFromZero(ctx, t, s, compaction(s, c.Client))
}

func TestWatchFromNonZero(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestWatchFromNonZero(ctx, t, s)
}

func TestDelayedWatchDelivery(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestDelayedWatchDelivery(ctx, t, s)
}

func TestWatchError(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestWatchError(ctx, t, s)
}

func TestWatchContextCancel(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestWatchContextCancel(ctx, t, s)
}

func TestWatcherTimeout(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestWatcherTimeout(ctx, t, s)
}

func TestWatchDeleteEventObjectHaveLatestRV(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestWatchDeleteEventObjectHaveLatestRV(ctx, t, s)
}

func TestWatchInitializationSignal(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestWatchInitializationSignal(ctx, t, s)
}

func TestProgressNotify(t *testing.T) {
	ctx, s, c := setup(t)
	storagetesting.RunOptionalTestProgressNotify(ctx, t, s, increaseRV(c.Client))
}

func TestWatchDispatchBookmarkEvents(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunTestWatchDispatchBookmarkEvents(ctx, t, s, false)
}

func TestSendInitialEventsBackwardCompatibility(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunSendInitialEventsBackwardCompatibility(ctx, t, s)
}

func TestWatchSemantics(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunWatchSemantics(ctx, t, s)
}

func TestWatchSemanticInitialEventsExtended(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunWatchSemanticInitialEventsExtended(ctx, t, s)
}

func TestWatchListMatchSingle(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunWatchListMatchSingle(ctx, t, s)
}

func TestWatchErrorIsBlockingFurtherEvents(t *testing.T) {
	ctx, s, _ := setup(t)
	storagetesting.RunWatchErrorIsBlockingFurtherEvents(ctx, t, s)
}
