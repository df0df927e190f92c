package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	bolt "go.etcd.io/bbolt"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemhttp"
	"github.com/archlab/idempotency/internal/testenv"
)

// TestDeleteUnknownKey: evicting a key that has no record must say
// so. An operator who mistypes the key or its scope (auth:<32 hex>) was told
// "deleted" and believed the key evicted.
func TestDeleteUnknownKey(t *testing.T) {
	up := newUpstream(t)
	path := filepath.Join(t.TempDir(), "idem.db")
	p := startInproc(t, "-upstream", up.URL, "-store", "bolt:"+path)
	base := "http://" + p.admin
	if r := do(t, http.MethodDelete, base+"/keys/no-such-key"); r.status != http.StatusNotFound {
		t.Fatalf("DELETE of an unknown key = %d %q; want 404", r.status, r.body)
	}
	mustPost(t, p.proxy, "/orders", "known", "x")
	if r := do(t, http.MethodDelete, base+"/keys/known?scope=auth:0123"); r.status != http.StatusNotFound {
		t.Fatalf("DELETE in the wrong scope = %d %q; want 404", r.status, r.body)
	}
	if r := do(t, http.MethodDelete, base+"/keys/known"); r.status != http.StatusOK {
		t.Fatalf("DELETE of a stored key = %d %q; want 200", r.status, r.body)
	}
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	err := run(context.Background(), []string{"delete", "-store", "bolt:" + path, "no-such-key"}, &out, &out, noEnv)
	if !errors.Is(err, idempotency.ErrNotFound) || strings.Contains(out.String(), "deleted") {
		t.Fatalf("idemproxy delete of an unknown key = %v, output %q; want ErrNotFound and no \"deleted\"", err, out.String())
	}
}

// A record that no longer decodes fails every request on its key; delete
// must still evict it (Get's error is not "not found").
func TestDeleteEvictsUndecodableRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	var out syncBuffer
	// Let the store make its buckets, then spoil one record in the file
	// (boltstore's layout: bucket "idempotency", records in "r" under 'k'
	// and the key).
	if err := run(context.Background(), []string{"delete", "-store", "bolt:" + path, "warm-up"}, &out, &out, noEnv); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("delete on a new file: %v", err)
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	key := idemhttp.StoreKey("", "broken")
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("idempotency")).Bucket([]byte("r")).Put([]byte("k"+key), []byte{0xff, 1, 2})
	})
	if cerr := db.Close(); err != nil || cerr != nil {
		t.Fatal(err, cerr)
	}
	if err := run(context.Background(), []string{"get", "-store", "bolt:" + path, "broken"}, &out, &out, noEnv); err == nil || errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("get of the spoiled record = %v; want a decoding error", err)
	}
	out = syncBuffer{}
	if err := run(context.Background(), []string{"delete", "-store", "bolt:" + path, "broken"}, &out, &out, noEnv); err != nil {
		t.Fatalf("delete of the spoiled record: %v (%s)", err, out.String())
	}
	if err := run(context.Background(), []string{"get", "-store", "bolt:" + path, "broken"}, &out, &out, noEnv); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("get after delete = %v; want ErrNotFound", err)
	}
}

// TestReadyzChecksWrites: a store that still answers reads but
// refuses writes (a Redis at maxmemory with noeviction, or a replica after a
// failover; a PostgreSQL standby) fails every guarded request with 503, so
// /readyz must not report the proxy ready.
func TestReadyzChecksWrites(t *testing.T) {
	rs := startRedisServer(t)
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "redis://"+rs.addr+"/0?max_retries=-1&prefix=readyz:")
	if r := get(t, "http://"+p.admin+"/readyz"); r.status != http.StatusOK {
		t.Fatalf("/readyz with a healthy store = %d %q", r.status, r.body)
	}
	c := redis.NewClient(&redis.Options{Addr: rs.addr})
	defer c.Close()
	if err := c.ConfigSet(context.Background(), "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if r := mustPost(t, p.proxy, "/orders", "oom", "x"); r.status != http.StatusServiceUnavailable {
		t.Fatalf("POST with the store refusing writes = %d %q; want 503 (precondition)", r.status, r.body)
	}
	if r := get(t, "http://"+p.admin+"/readyz"); r.status != http.StatusServiceUnavailable {
		t.Fatalf("/readyz while every guarded request gets 503 = %d %q; want 503", r.status, r.body)
	}
	if err := c.ConfigSet(context.Background(), "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if r := get(t, "http://"+p.admin+"/readyz"); r.status != http.StatusOK {
		t.Fatalf("/readyz after recovery = %d %q; want 200", r.status, r.body)
	}
}

// TestReleaseRunningKeyRefused: releasing a key whose request this
// proxy is still running upstream lets a retry run the operation a second
// time while the first is under way, and the first's next lease renewal
// fails and cancels its upstream call mid-flight. The admin API refuses
// it unless told ?force=true.
func TestReleaseRunningKeyRefused(t *testing.T) {
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory")
	base := "http://" + p.admin
	done := make(chan reply, 1)
	go func() {
		r, _ := post(t, &http.Client{Timeout: 30 * time.Second}, p.proxy, "/block", "running", "x")
		done <- r
	}()
	deadline := time.Now().Add(10 * time.Second)
	for up.ran("running") == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if r := do(t, http.MethodPost, base+"/keys/running/release"); r.status != http.StatusConflict ||
		!strings.Contains(r.body, "force") {
		t.Fatalf("release of a key running here = %d %q; want 409 naming ?force=true", r.status, r.body)
	}
	if r := mustPost(t, p.proxy, "/block", "running", "x"); r.status != http.StatusConflict {
		t.Fatalf("retry after a refused release = %d %q; want 409 (still in flight)", r.status, r.body)
	}
	if r := do(t, http.MethodPost, base+"/keys/running/release?force=true"); r.status != http.StatusOK {
		t.Fatalf("forced release = %d %q; want 200", r.status, r.body)
	}
	up.open()
	<-done
	// Once the request is over, a claim it kept (none here) may be
	// released without force; a done key still answers 409 not in flight.
	if r := do(t, http.MethodPost, base+"/keys/running/release"); r.status == http.StatusOK {
		t.Fatalf("release after the request ended = %d %q", r.status, r.body)
	}
}

// TestKeptClaimReleasable: the claim an upstream timeout kept is
// not running any more: release needs no force, and the retry runs.
func TestKeptClaimReleasable(t *testing.T) {
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-upstream-timeout", "100ms", "-lease", "30s")
	if r := mustPost(t, p.proxy, "/pay?sleep=300ms", "kept", "x"); r.status != http.StatusGatewayTimeout {
		t.Fatalf("upstream timeout = %d %q; want 504", r.status, r.body)
	}
	if r := do(t, http.MethodPost, "http://"+p.admin+"/keys/kept/release"); r.status != http.StatusOK {
		t.Fatalf("release of a kept claim = %d %q; want 200", r.status, r.body)
	}
	if r := mustPost(t, p.proxy, "/pay", "kept", "x"); r.status != http.StatusCreated {
		t.Fatalf("retry after release = %d %q; want 201", r.status, r.body)
	}
}

// TestClientGoneBeforeResponse: the client times out while the
// upstream is still working. The upstream call goes on, its response is
// stored, and the retry replays it.
func TestClientGoneBeforeResponse(t *testing.T) {
	for _, timeout := range []string{"0", "1m"} {
		t.Run("upstream-timeout="+timeout, func(t *testing.T) {
			up := newUpstream(t)
			p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-upstream-timeout", timeout, "-wait", "10s")
			_, err := post(t, &http.Client{Timeout: 100 * time.Millisecond}, p.proxy, "/orders?sleep=500ms", "gone", "x")
			if err == nil {
				t.Fatal("the client did not time out")
			}
			r := mustPost(t, p.proxy, "/orders?sleep=500ms", "gone", "x")
			if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("retry = %d %v %q; want the stored 201 replayed", r.status, r.header, r.body)
			}
			if n := up.ran("gone"); n != 1 {
				t.Fatalf("upstream ran %d times; want 1", n)
			}
		})
	}
}

// TestBodyTooLarge: a guarded body over -max-body, with or without
// Content-Length, gets 413 and never reaches the upstream.
func TestBodyTooLarge(t *testing.T) {
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-max-body", "1000")
	for _, chunked := range []bool{false, true} {
		body := io.Reader(strings.NewReader(strings.Repeat("x", 5000)))
		if chunked {
			body = io.MultiReader(body) // unknown length: sent chunked
		}
		req, _ := http.NewRequest(http.MethodPost, "http://"+p.proxy+"/orders", body)
		req.Header.Set("Idempotency-Key", `"big-`+strconv.FormatBool(chunked)+`"`)
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("chunked=%v: %d; want 413", chunked, resp.StatusCode)
		}
	}
	if n := up.total.Load(); n != 0 {
		t.Fatalf("the upstream was called %d times; want 0", n)
	}
	m := get(t, "http://"+p.admin+"/metrics").body
	if !strings.Contains(m, `idemproxy_requests_total{outcome="too_large"} 2`) {
		t.Fatalf("metrics: want 2 too_large:\n%s", grepLines(m, "idemproxy_requests_total"))
	}
}

// TestMetricsCounts: one executed request, one replay, one in-flight
// duplicate and one unguarded GET are each counted once, and nothing is
// left in flight afterwards.
func TestMetricsCounts(t *testing.T) {
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory")
	done := make(chan reply, 1)
	go func() {
		r, _ := post(t, &http.Client{Timeout: 30 * time.Second}, p.proxy, "/block", "m", "x")
		done <- r
	}()
	deadline := time.Now().Add(10 * time.Second)
	for up.ran("m") == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if r := mustPost(t, p.proxy, "/block", "m", "x"); r.status != http.StatusConflict {
		t.Fatalf("duplicate = %d", r.status)
	}
	if v := metricValue(t, p.admin, "idemproxy_requests_in_flight"); v != 1 {
		t.Fatalf("in flight while one request runs = %v; want 1", v)
	}
	up.open()
	<-done
	mustPost(t, p.proxy, "/block", "m", "x")
	get(t, "http://"+p.proxy+"/orders")
	for name, want := range map[string]float64{
		`idemproxy_requests_total{outcome="executed"}`:          1,
		`idemproxy_requests_total{outcome="replayed"}`:          1,
		`idemproxy_requests_total{outcome="in_flight"}`:         1,
		`idemproxy_requests_unguarded_total`:                    1,
		`idemproxy_requests_in_flight`:                          0,
		`idemproxy_store_duration_seconds_count{op="begin"}`:    3,
		`idemproxy_store_duration_seconds_count{op="complete"}`: 1,
	} {
		if v := metricValue(t, p.admin, name); v != want {
			t.Errorf("%s = %v; want %v", name, v, want)
		}
	}
}

func metricValue(t *testing.T, admin, name string) float64 {
	t.Helper()
	body := get(t, "http://"+admin+"/metrics").body
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`)
	m := re.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no %s in /metrics:\n%s", name, grepLines(body, "idemproxy_"))
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestPostgresSwept: nothing deleted expired PostgreSQL rows (the
// store's Sweep was never called), so the table of a proxy grew by a row
// for every key it ever saw. Records past their retention must go.
func TestPostgresSwept(t *testing.T) {
	store, schema := testenv.PostgresStoreURL(t, "idemproxy_sweep_")
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", store, "-lease", "1s", "-retention", "1s")
	for _, k := range []string{"a", "b", "c"} {
		if r := mustPost(t, p.proxy, "/orders", k, "x"); r.status != http.StatusCreated {
			t.Fatalf("POST %s = %d %q", k, r.status, r.body)
		}
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	count := func() int {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+schema+".idempotency_keys").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n != 3 {
		t.Fatalf("%d rows after three keys; want 3", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for count() != 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if n := count(); n != 0 {
		t.Fatalf("%d rows 10s after their 1s retention ended; want 0 (swept)", n)
	}
}

// TestUpstreamTimeoutEveryPath: -upstream-timeout bounds a guarded
// exchange (through the Guard's Timeout), a request without a key and an
// unguarded method alike: 504 once it has passed, and the upstream's
// request is cut off rather than waited for.
func TestUpstreamTimeoutEveryPath(t *testing.T) {
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-upstream-timeout", "200ms")
	for _, tc := range []struct {
		name   string
		method string
		key    string
	}{
		{"guarded", http.MethodPost, "slow"},
		{"no key", http.MethodPost, ""},
		{"unguarded method", http.MethodGet, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, "http://"+p.proxy+"/pay?sleep=3s", strings.NewReader("x"))
			if err != nil {
				t.Fatal(err)
			}
			if tc.key != "" {
				req.Header.Set("Idempotency-Key", `"`+tc.key+`"`)
			}
			start := time.Now()
			resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusGatewayTimeout {
				t.Errorf("status = %d; want 504", resp.StatusCode)
			}
			// Far below the upstream's 3s: the exchange was cut at the timeout.
			if took := time.Since(start); took >= 3*time.Second {
				t.Errorf("answered after %v: the timeout did not cut the exchange", took)
			}
		})
	}
}
