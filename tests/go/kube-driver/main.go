// Command kube-driver drives a real kube-apiserver with client-go, the way
// kubelets and controllers do, and prints what happened as JSON lines on
// stdout for tests/it/kube_apiserver and bench/kube-capacity.sh.
//
// Scenarios (-scenario):
//
//	leases     -nodes N node Leases in kube-node-lease, created, then renewed
//	           -renewals times each as the kubelet does (update with the
//	           copy it holds; on a conflict get and update again)
//	events     -events N Events created in namespace default, listed in
//	           pages of -page, and watched from the resource version of a
//	           list taken before the first create
//	informers  informers on every Lease and every Event; prints
//	           {"step":"synced"}, then on each line read from stdin prints
//	           {"step":"counts"} with how many lists each informer made and
//	           how many objects it holds (node_leases: those in
//	           kube-node-lease)
//	crd        creates the CustomResourceDefinition widgets.ephd.example
//	           (namespaced, v1), waits until it is established, creates
//	           -events N widgets in namespace default and lists them
//	ready      waits up to -timeout for /readyz, then prints every check of
//	           /readyz?verbose and /livez?verbose
//	metrics    prints the samples of /metrics whose name is one of the
//	           comma-separated -metrics
//	load       -nodes N Leases renewed every -interval and -events-per-s
//	           Events created, for -duration; prints latency percentiles of
//	           the renewals, the failures and the longest stall
//
// Every scenario ends with {"step":"done"}; a fatal error prints
// {"fatal":...} and exits 1.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

func emit(m map[string]any) {
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	fmt.Println(string(b))
}

func fatal(format string, args ...any) {
	emit(map[string]any{"fatal": fmt.Sprintf(format, args...)})
	os.Exit(1)
}

const leaseNamespace = "kube-node-lease"

func main() {
	server := flag.String("server", "", "kube-apiserver URL")
	token := flag.String("token", "", "bearer token")
	scenario := flag.String("scenario", "", "leases, events, informers or load")
	nodes := flag.Int("nodes", 10, "node Leases")
	renewals := flag.Int("renewals", 3, "renewals per Lease (leases)")
	events := flag.Int("events", 100, "Events (events)")
	page := flag.Int64("page", 10, "list page size (events)")
	interval := flag.Duration("interval", time.Second, "renewal interval (load)")
	eventsPerS := flag.Float64("events-per-s", 10, "Events created per second (load)")
	duration := flag.Duration("duration", 10*time.Second, "how long to load (load)")
	prefix := flag.String("prefix", "node", "name prefix of Leases and Events")
	timeout := flag.Duration("timeout", time.Minute, "how long to wait for /readyz (ready)")
	metricNames := flag.String("metrics", "", "comma-separated metric names (metrics)")
	flag.Parse()

	cfg := &rest.Config{
		Host:            *server,
		BearerToken:     *token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS:             -1, // no client-side rate limit: the server is measured
		Timeout:         30 * time.Second,
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fatal("client: %v", err)
	}
	switch *scenario {
	case "leases":
		leases(cs, *prefix, *nodes, *renewals)
	case "events":
		eventsScenario(cs, *prefix, *events, *page)
	case "informers":
		informers(cs)
	case "crd":
		crd(cfg, *events)
	case "ready":
		ready(cs, *timeout)
	case "metrics":
		metrics(cs, strings.Split(*metricNames, ","))
	case "load":
		load(cs, *prefix, *nodes, *interval, *eventsPerS, *duration)
	default:
		fatal("unknown -scenario %q", *scenario)
	}
	emit(map[string]any{"step": "done"})
}

// nodeLease is one kubelet's heartbeat: the Lease it last wrote.
type nodeLease struct {
	cs   *kubernetes.Clientset
	held *coordinationv1.Lease
}

func newNodeLease(ctx context.Context, cs *kubernetes.Clientset, name string) (*nodeLease, error) {
	holder := name
	duration := int32(40)
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: leaseNamespace},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &holder,
			LeaseDurationSeconds: &duration,
			RenewTime:            &now,
		},
	}
	created, err := cs.CoordinationV1().Leases(leaseNamespace).Create(ctx, lease, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = cs.CoordinationV1().Leases(leaseNamespace).Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return nil, err
	}
	return &nodeLease{cs: cs, held: created}, nil
}

// renew updates the held copy's renew time; on a conflict it reads the
// Lease again and retries once, as the kubelet's lease controller does.
func (n *nodeLease) renew(ctx context.Context) error {
	client := n.cs.CoordinationV1().Leases(leaseNamespace)
	for attempt := 0; ; attempt++ {
		next := n.held.DeepCopy()
		now := metav1.NewMicroTime(time.Now())
		next.Spec.RenewTime = &now
		updated, err := client.Update(ctx, next, metav1.UpdateOptions{})
		if err == nil {
			n.held = updated
			return nil
		}
		if !apierrors.IsConflict(err) || attempt > 0 {
			return err
		}
		fresh, getErr := client.Get(ctx, n.held.Name, metav1.GetOptions{})
		if getErr != nil {
			return getErr
		}
		n.held = fresh
	}
}

func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p)
	return float64(sorted[i].Microseconds()) / 1000
}

func leases(cs *kubernetes.Clientset, prefix string, nodes, renewals int) {
	ctx := context.Background()
	held := make([]*nodeLease, nodes)
	for i := range held {
		n, err := newNodeLease(ctx, cs, fmt.Sprintf("%s-%d", prefix, i))
		if err != nil {
			fatal("create lease %d: %v", i, err)
		}
		held[i] = n
	}
	var failed []string
	for r := 0; r < renewals; r++ {
		for i, n := range held {
			if err := n.renew(ctx); err != nil {
				failed = append(failed, fmt.Sprintf("%d/%d: %v", i, r, err))
			}
		}
	}
	list, err := cs.CoordinationV1().Leases(leaseNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		fatal("list leases: %v", err)
	}
	versions := map[string]string{}
	for _, l := range list.Items {
		versions[l.Name] = l.ResourceVersion
	}
	stale := 0
	for _, n := range held {
		if versions[n.held.Name] != n.held.ResourceVersion {
			stale++
		}
	}
	emit(map[string]any{"step": "leases", "created": nodes, "renewed": nodes*renewals - len(failed),
		"failed": failed, "listed": len(list.Items), "list_rv": list.ResourceVersion, "stale": stale})
}

func event(prefix string, i int) *corev1.Event {
	now := metav1.NewTime(time.Now())
	return &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-event-%d", prefix, i), Namespace: "default"},
		InvolvedObject: corev1.ObjectReference{
			Kind: "Node", Name: fmt.Sprintf("%s-%d", prefix, i), APIVersion: "v1",
		},
		Reason:         "NodeReady",
		Message:        "kube-driver event",
		Type:           corev1.EventTypeNormal,
		Source:         corev1.EventSource{Component: "kube-driver"},
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	}
}

func eventsScenario(cs *kubernetes.Clientset, prefix string, n int, page int64) {
	ctx := context.Background()
	client := cs.CoreV1().Events("default")
	before, err := client.List(ctx, metav1.ListOptions{})
	if err != nil {
		fatal("list events: %v", err)
	}
	w, err := client.Watch(ctx, metav1.ListOptions{ResourceVersion: before.ResourceVersion})
	if err != nil {
		fatal("watch events: %v", err)
	}
	for i := 0; i < n; i++ {
		if _, err := client.Create(ctx, event(prefix, i), metav1.CreateOptions{}); err != nil {
			fatal("create event %d: %v", i, err)
		}
	}
	names := map[string]bool{}
	pages := 0
	cont := ""
	for {
		list, err := client.List(ctx, metav1.ListOptions{Limit: page, Continue: cont})
		if err != nil {
			fatal("list page %d: %v", pages, err)
		}
		pages++
		for _, e := range list.Items {
			names[e.Name] = true
		}
		cont = list.Continue
		if cont == "" {
			break
		}
	}
	watched := 0
	deadline := time.After(30 * time.Second)
	watchErr := ""
	for watched < n && watchErr == "" {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				watchErr = "watch closed"
			} else if ev.Type == watch.Added {
				watched++
			} else if ev.Type == watch.Error {
				watchErr = fmt.Sprintf("%v", ev.Object)
			}
		case <-deadline:
			watchErr = "timed out"
		}
	}
	w.Stop()
	emit(map[string]any{"step": "events", "created": n, "listed": len(names), "pages": pages,
		"watched": watched, "watch_error": watchErr})
}

// countingListWatch counts the initial listings an informer makes, as a
// list or as a watch that sends its initial events (client-go's watch-list):
// every one after the first is a relist.
type countingListWatch struct {
	cache.ListerWatcher
	lists atomic.Int64
}

func (c *countingListWatch) List(options metav1.ListOptions) (runtime.Object, error) {
	c.lists.Add(1)
	return c.ListerWatcher.List(options)
}

func (c *countingListWatch) Watch(options metav1.ListOptions) (watch.Interface, error) {
	if options.SendInitialEvents != nil && *options.SendInitialEvents {
		c.lists.Add(1)
	}
	return c.ListerWatcher.Watch(options)
}

// ready waits for /readyz and prints the verbose checks of /readyz and
// /livez, one "[+]name ok" line each.
func ready(cs *kubernetes.Clientset, timeout time.Duration) {
	ctx := context.Background()
	rc := cs.Discovery().RESTClient()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		body, err := rc.Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && strings.TrimSpace(string(body)) == "ok" {
			break
		}
		last = fmt.Sprintf("%v %s", err, body)
		if time.Now().After(deadline) {
			fatal("not ready after %v: %s", timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
	checks := map[string][]string{}
	for _, path := range []string{"/readyz", "/livez"} {
		body, err := rc.Get().AbsPath(path).Param("verbose", "").DoRaw(ctx)
		if err != nil {
			fatal("%s?verbose: %v %s", path, err, body)
		}
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, "[") {
				checks[strings.TrimPrefix(path, "/")] = append(checks[strings.TrimPrefix(path, "/")], line)
			}
		}
	}
	emit(map[string]any{"step": "ready", "readyz": checks["readyz"], "livez": checks["livez"]})
}

// metrics prints {"step":"metrics","samples":{"name{labels}":value}} for
// every sample of the named metrics.
func metrics(cs *kubernetes.Clientset, names []string) {
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		fatal("/metrics: %v", err)
	}
	samples := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		sample, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(sample, "{")
		for _, want := range names {
			if name == want {
				v, err := strconv.ParseFloat(value, 64)
				if err == nil {
					samples[sample] = v
				}
			}
		}
	}
	emit(map[string]any{"step": "metrics", "samples": samples})
}

func informers(cs *kubernetes.Clientset) {
	leaseLW := &countingListWatch{ListerWatcher: cache.NewListWatchFromClient(
		cs.CoordinationV1().RESTClient(), "leases", metav1.NamespaceAll, fields.Everything())}
	eventLW := &countingListWatch{ListerWatcher: cache.NewListWatchFromClient(
		cs.CoreV1().RESTClient(), "events", metav1.NamespaceAll, fields.Everything())}
	leaseInformer := cache.NewSharedInformer(leaseLW, &coordinationv1.Lease{}, 0)
	eventInformer := cache.NewSharedInformer(eventLW, &corev1.Event{}, 0)
	stop := make(chan struct{})
	go leaseInformer.Run(stop)
	go eventInformer.Run(stop)
	if !cache.WaitForCacheSync(stop, leaseInformer.HasSynced, eventInformer.HasSynced) {
		fatal("informers did not sync")
	}
	emit(map[string]any{"step": "synced"})
	scanner := bufio.NewScanner(os.Stdin)
	for scanner.Scan() {
		nodeLeases := 0
		for _, key := range leaseInformer.GetStore().ListKeys() {
			if strings.HasPrefix(key, leaseNamespace+"/") {
				nodeLeases++
			}
		}
		emit(map[string]any{"step": "counts",
			"lease_lists": leaseLW.lists.Load(), "leases": len(leaseInformer.GetStore().ListKeys()),
			"node_leases": nodeLeases,
			"event_lists": eventLW.lists.Load(), "events": len(eventInformer.GetStore().ListKeys()),
			"lease_rv": leaseInformer.LastSyncResourceVersion(),
			"event_rv": eventInformer.LastSyncResourceVersion()})
	}
	close(stop)
}

func load(cs *kubernetes.Clientset, prefix string, nodes int, interval time.Duration,
	eventsPerS float64, duration time.Duration) {
	ctx := context.Background()
	held := make([]*nodeLease, nodes)
	var wg sync.WaitGroup
	var createErr atomic.Value
	sem := make(chan struct{}, 32)
	for i := range held {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer func() { <-sem; wg.Done() }()
			n, err := newNodeLease(ctx, cs, fmt.Sprintf("%s-%d", prefix, i))
			if err != nil {
				createErr.Store(err.Error())
				return
			}
			held[i] = n
		}(i)
	}
	wg.Wait()
	if e := createErr.Load(); e != nil {
		fatal("create leases: %v", e)
	}
	emit(map[string]any{"step": "created", "nodes": nodes})

	var mu sync.Mutex
	var latencies []time.Duration
	var failures []string
	var lastAck atomic.Int64
	lastAck.Store(time.Now().UnixNano())
	var longestStall atomic.Int64
	ack := func() {
		now := time.Now().UnixNano()
		prev := lastAck.Swap(now)
		if gap := now - prev; gap > longestStall.Load() {
			longestStall.Store(gap)
		}
	}
	end := time.Now().Add(duration)
	for i, n := range held {
		wg.Add(1)
		// Spread the nodes over the interval, as kubelets started at
		// different times are.
		offset := time.Duration(int64(interval) * int64(i) / int64(nodes))
		go func(n *nodeLease) {
			defer wg.Done()
			next := time.Now().Add(offset)
			for {
				time.Sleep(time.Until(next))
				if time.Now().After(end) {
					return
				}
				start := time.Now()
				err := n.renew(ctx)
				took := time.Since(start)
				mu.Lock()
				if err != nil {
					failures = append(failures, err.Error())
				} else {
					latencies = append(latencies, took)
				}
				mu.Unlock()
				if err == nil {
					ack()
				}
				next = next.Add(interval)
			}
		}(n)
	}
	var eventsCreated, eventFailures atomic.Int64
	if eventsPerS > 0 {
		gap := time.Duration(float64(time.Second) / eventsPerS)
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				next := time.Now().Add(gap * time.Duration(w))
				for i := w; ; i += 8 {
					time.Sleep(time.Until(next))
					if time.Now().After(end) {
						return
					}
					_, err := cs.CoreV1().Events("default").Create(ctx, event(prefix, i), metav1.CreateOptions{})
					if err != nil {
						eventFailures.Add(1)
					} else {
						eventsCreated.Add(1)
					}
					next = next.Add(gap * 8)
				}
			}(w)
		}
	}
	wg.Wait()
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	shown := failures
	if len(shown) > 5 {
		shown = shown[:5]
	}
	emit(map[string]any{"step": "load", "nodes": nodes, "interval_s": interval.Seconds(),
		"renewals": len(latencies), "failed": len(failures), "failures": shown,
		"p50_ms": percentile(latencies, 0.5), "p99_ms": percentile(latencies, 0.99),
		"max_ms": percentile(latencies, 1), "longest_stall_ms": float64(longestStall.Load()) / 1e6,
		"events": eventsCreated.Load(), "event_failures": eventFailures.Load()})
}

// crd creates a namespaced custom resource type through apiextensions and
// n objects of it, with the dynamic client.
func crd(cfg *rest.Config, n int) {
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		fatal("dynamic client: %v", err)
	}
	crds := dyn.Resource(schema.GroupVersionResource{
		Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	definition := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": "widgets.ephd.example"},
		"spec": map[string]any{
			"group": "ephd.example",
			"scope": "Namespaced",
			"names": map[string]any{"plural": "widgets", "singular": "widget", "kind": "Widget"},
			"versions": []any{map[string]any{
				"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type":                                 "object",
					"x-kubernetes-preserve-unknown-fields": true,
				}},
			}},
		},
	}}
	if _, err := crds.Create(ctx, definition, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		fatal("create CRD: %v", err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		got, err := crds.Get(ctx, "widgets.ephd.example", metav1.GetOptions{})
		if err == nil && established(got) {
			break
		}
		if time.Now().After(deadline) {
			fatal("CRD not established: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	widgets := dyn.Resource(schema.GroupVersionResource{Group: "ephd.example", Version: "v1", Resource: "widgets"}).
		Namespace("default")
	created := 0
	// The resource is served shortly after it is established.
	for i := 0; i < n; i++ {
		widget := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "ephd.example/v1",
			"kind":       "Widget",
			"metadata":   map[string]any{"name": fmt.Sprintf("widget-%d", i)},
			"spec":       map[string]any{"size": i},
		}}
		for {
			_, err := widgets.Create(ctx, widget, metav1.CreateOptions{})
			if err == nil || apierrors.IsAlreadyExists(err) {
				break
			}
			if !apierrors.IsNotFound(err) || time.Now().After(deadline) {
				fatal("create widget %d: %v", i, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		created++
	}
	list, err := widgets.List(ctx, metav1.ListOptions{})
	if err != nil {
		fatal("list widgets: %v", err)
	}
	emit(map[string]any{"step": "crd", "created": created, "listed": len(list.Items)})
}

func established(crd *unstructured.Unstructured) bool {
	conditions, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conditions {
		m, ok := c.(map[string]any)
		if ok && m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}
