// Command clientv3-driver drives an etcd-compatible cluster with etcd's own
// Go client (clientv3 3.6, the one kube-apiserver 1.34+ vendors) and prints what
// happened as JSON lines on stdout, for tests/it/go_client to assert on.
//
// Why: kube-apiserver and most etcd users talk to etcd through this client,
// whose grpc-go balancer spreads requests over every endpoint, whose
// WithRequireLeader watches carry the "hasleader" metadata, and whose retry
// interceptor decides what is retried when a member goes away. A Rust client
// exercises none of that.
//
// Scenarios (-scenario):
//
//	basic     member list, Status of every endpoint, puts and linearizable
//	          gets and a txn through the balancer, a WithRequireLeader watch
//	failover  a writer puts keys one after the other while a watch
//	          (WithRequireLeader) follows them; it prints {"step":"writing"}
//	          once writes flow, and the caller kills the leader then writes a
//	          line on stdin; the summary says which puts were acknowledged,
//	          the errors, the longest gap between acknowledgements, and what
//	          the watch saw; it writes until -duration after that line
//	          (puts time out after 3 s, as a client with a short deadline)
//	noleader  with one endpoint: a WithRequireLeader watch and, once the
//	          caller has killed the other members and written a line on
//	          stdin, how the watch ends and what a WithRequireLeader get
//	          answers on the member left without a leader
//
// Every line is a JSON object with a "step" field; the last one of a
// scenario that ran to its end is {"step":"done"}.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func emit(m map[string]interface{}) {
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	fmt.Println(string(b))
}

func fail(step string, err error) {
	emit(map[string]interface{}{"step": step, "fatal": err.Error()})
	os.Exit(1)
}

func main() {
	endpoints := flag.String("endpoints", "", "comma-separated client URLs of every member")
	scenario := flag.String("scenario", "basic", "basic or failover")
	duration := flag.Duration("duration", 6*time.Second, "failover: how long the writer goes on after the kill")
	flag.Parse()
	eps := strings.Split(*endpoints, ",")
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   eps,
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		fail("connect", err)
	}
	defer cli.Close()
	switch *scenario {
	case "basic":
		basic(cli, eps)
	case "failover":
		failover(cli, *duration)
	case "noleader":
		noLeader(cli)
	default:
		fail("args", fmt.Errorf("unknown scenario %q", *scenario))
	}
	emit(map[string]interface{}{"step": "done"})
}

func timeout() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 5*time.Second)
}

func basic(cli *clientv3.Client, eps []string) {
	ctx, cancel := timeout()
	members, err := cli.MemberList(ctx)
	cancel()
	if err != nil {
		fail("members", err)
	}
	var names []string
	for _, m := range members.Members {
		names = append(names, m.Name)
	}
	sort.Strings(names)
	emit(map[string]interface{}{"step": "members", "names": names})

	leaders := map[uint64]bool{}
	for _, ep := range eps {
		ctx, cancel := timeout()
		st, err := cli.Status(ctx, ep)
		cancel()
		if err != nil {
			fail("status", fmt.Errorf("%s: %v", ep, err))
		}
		leaders[st.Leader] = true
	}
	emit(map[string]interface{}{"step": "status", "endpoints": len(eps), "distinct_leaders": len(leaders)})

	const n = 90
	putErrors, getErrors, mismatches := 0, 0, 0
	for i := 0; i < n; i++ {
		key, val := fmt.Sprintf("basic/%04d", i), fmt.Sprintf("v%d", i)
		ctx, cancel := timeout()
		_, err := cli.Put(ctx, key, val)
		cancel()
		if err != nil {
			putErrors++
			continue
		}
		ctx, cancel = timeout()
		resp, err := cli.Get(ctx, key)
		cancel()
		if err != nil {
			getErrors++
		} else if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != val {
			mismatches++
		}
	}
	ctx, cancel = timeout()
	all, err := cli.Get(ctx, "basic/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	cancel()
	if err != nil {
		fail("kv", err)
	}
	emit(map[string]interface{}{"step": "kv", "puts": n, "put_errors": putErrors,
		"get_errors": getErrors, "mismatches": mismatches, "count": all.Count})

	ctx, cancel = timeout()
	txn, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value("basic/0000"), "=", "v0")).
		Then(clientv3.OpPut("basic/txn", "yes")).
		Else(clientv3.OpPut("basic/txn", "no")).
		Commit()
	cancel()
	if err != nil {
		fail("txn", err)
	}
	emit(map[string]interface{}{"step": "txn", "succeeded": txn.Succeeded})

	// A watch with the "hasleader" metadata, as kube-apiserver opens them.
	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	defer wcancel()
	start := all.Header.Revision + 1
	wch := cli.Watch(wctx, "watch/", clientv3.WithPrefix(), clientv3.WithRev(start))
	const w = 30
	for i := 0; i < w; i++ {
		ctx, cancel := timeout()
		_, err := cli.Put(ctx, fmt.Sprintf("watch/%02d", i), "x")
		cancel()
		if err != nil {
			fail("watch-put", err)
		}
	}
	got, ordered, lastRev, canceled := watchUntil(wch, w, 10*time.Second)
	emit(map[string]interface{}{"step": "watch", "events": got, "ordered": ordered,
		"canceled": canceled, "last_rev": lastRev})
}

// watchUntil reads put events from wch until it has `want` of them or
// `limit` passes; it reports whether their keys came in order.
func watchUntil(wch clientv3.WatchChan, want int, limit time.Duration) (int, bool, int64, string) {
	deadline := time.After(limit)
	got, ordered, lastRev := 0, true, int64(0)
	for got < want {
		select {
		case resp, ok := <-wch:
			if !ok {
				return got, ordered, lastRev, "channel closed"
			}
			if resp.Canceled || resp.Err() != nil {
				return got, ordered, lastRev, fmt.Sprint(resp.Err())
			}
			for _, ev := range resp.Events {
				if ev.Kv.ModRevision <= lastRev {
					ordered = false
				}
				lastRev = ev.Kv.ModRevision
				got++
			}
		case <-deadline:
			return got, ordered, lastRev, "timeout"
		}
	}
	return got, ordered, lastRev, ""
}

func failover(cli *clientv3.Client, duration time.Duration) {
	ctx, cancel := timeout()
	warm, err := cli.Put(ctx, "fo/warm", "x")
	cancel()
	if err != nil {
		fail("warm-up", err)
	}
	// The watch follows every write from the warm-up on.
	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	defer wcancel()
	wch := cli.Watch(wctx, "fo/k", clientv3.WithPrefix(), clientv3.WithRev(warm.Header.Revision+1))

	var mu sync.Mutex
	killedAt := -1 // acknowledged puts when the caller said it killed
	acked := 0
	// Write until `duration` after the kill, and 40 s at most.
	end := time.Now().Add(40 * time.Second)
	go func() {
		// The caller writes a line once it has killed the leader.
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err == nil {
			mu.Lock()
			killedAt = acked
			end = time.Now().Add(duration)
			mu.Unlock()
		}
	}()
	writing := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return time.Now().Before(end)
	}

	var failed []int
	errs := map[string]int{}
	seen := map[string]int64{} // acknowledged key -> its revision
	var lastRev int64
	maxGap := time.Duration(0)
	lastAck := time.Now()
	attempted := 0
	for i := 1; writing(); i++ {
		attempted++
		key := fmt.Sprintf("fo/k%06d", i)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		resp, err := cli.Put(ctx, key, "v")
		cancel()
		if err != nil {
			failed = append(failed, i)
			errs[err.Error()]++
			continue
		}
		now := time.Now()
		if gap := now.Sub(lastAck); gap > maxGap {
			maxGap = gap
		}
		lastAck = now
		seen[key] = resp.Header.Revision
		if resp.Header.Revision > lastRev {
			lastRev = resp.Header.Revision
		}
		mu.Lock()
		acked++
		if acked == 50 {
			emit(map[string]interface{}{"step": "writing"})
		}
		mu.Unlock()
	}

	// The watch must deliver every acknowledged put, once, in order.
	events, dups, outOfOrder := 0, 0, 0
	watched := map[string]bool{}
	var watchRev int64
	watchErr := ""
	deadline := time.After(10 * time.Second)
loop:
	for watchRev < lastRev {
		select {
		case resp, ok := <-wch:
			if !ok {
				watchErr = "channel closed"
				break loop
			}
			if resp.Canceled || resp.Err() != nil {
				watchErr = fmt.Sprint(resp.Err())
				break loop
			}
			for _, ev := range resp.Events {
				events++
				k := string(ev.Kv.Key)
				if watched[k] {
					dups++
				}
				watched[k] = true
				if ev.Kv.ModRevision <= watchRev {
					outOfOrder++
				}
				watchRev = ev.Kv.ModRevision
			}
		case <-deadline:
			watchErr = "timeout"
			break loop
		}
	}
	missing := 0
	for k := range seen {
		if !watched[k] {
			missing++
		}
	}
	mu.Lock()
	defer mu.Unlock()
	emit(map[string]interface{}{"step": "failover", "attempted": attempted, "acked": acked,
		"acked_at_kill": killedAt, "failed": failed, "errors": errs,
		"max_gap_ms": maxGap.Milliseconds(), "last_rev": lastRev,
		"watch_events": events, "watch_dups": dups, "watch_out_of_order": outOfOrder,
		"watch_missing_acked": missing, "watch_err": watchErr})
}

func noLeader(cli *clientv3.Client) {
	ctx, cancel := timeout()
	warm, err := cli.Put(ctx, "nl/warm", "x")
	cancel()
	if err != nil {
		fail("warm-up", err)
	}
	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	defer wcancel()
	wch := cli.Watch(wctx, "nl/", clientv3.WithPrefix(), clientv3.WithRev(warm.Header.Revision))
	if got, _, _, why := watchUntil(wch, 1, 10*time.Second); got != 1 {
		fail("watch", fmt.Errorf("no event for the warm-up put: %s", why))
	}
	emit(map[string]interface{}{"step": "watching"})
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fail("stdin", err)
	}
	killed := time.Now()
	// How the watch ends: etcd cancels a "hasleader" watch once its member
	// has had no leader for a while, and clientv3 then closes the channel.
	watchErr, closedAfter := "still open after 15s", int64(-1)
	deadline := time.After(15 * time.Second)
wait:
	for {
		select {
		case resp, ok := <-wch:
			if !ok {
				watchErr, closedAfter = "channel closed", time.Since(killed).Milliseconds()
				break wait
			}
			if resp.Canceled || resp.Err() != nil {
				watchErr, closedAfter = fmt.Sprint(resp.Err()), time.Since(killed).Milliseconds()
				break wait
			}
		case <-deadline:
			break wait
		}
	}
	gctx, gcancel := context.WithTimeout(clientv3.WithRequireLeader(context.Background()), 3*time.Second)
	start := time.Now()
	_, err = cli.Get(gctx, "nl/warm")
	gcancel()
	getErr := "<nil>"
	if err != nil {
		getErr = err.Error()
	}
	emit(map[string]interface{}{"step": "noleader", "watch_err": watchErr,
		"watch_closed_after_ms": closedAfter, "get_err": getErr,
		"get_ms": time.Since(start).Milliseconds()})
}
