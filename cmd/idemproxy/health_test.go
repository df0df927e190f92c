package main

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemhttp"
)

// failingStore is a working store that reports, through Failed, that it
// failed closed once fail is set, as boltstore.Store does after a commit
// it cannot vouch for.
type failingStore struct {
	*idempotency.MemoryStore
	fail atomic.Pointer[error]
}

func (s *failingStore) Failed() error {
	if p := s.fail.Load(); p != nil {
		return *p
	}
	return nil
}

// A store that failed closed fails the liveness probe, so that the
// supervisor restarts the process (a restart reopens the store; waiting
// does not), while a store that works keeps it at 200.
func TestHealthzFailsOnceStoreFailedClosed(t *testing.T) {
	s := &failingStore{MemoryStore: idempotency.NewMemoryStore()}
	h := adminHandler(s, s, newMetrics(), idemhttp.StoreKey, time.Now, newRunningSet(nil), nil)
	probe := func() (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := probe(); code != http.StatusOK {
		t.Fatalf("/healthz on a working store = %d %s, want 200", code, body)
	}
	err := errors.New("boltstore: failed closed after a commit failed")
	s.fail.Store(&err)
	if code, body := probe(); code != http.StatusServiceUnavailable || !strings.Contains(body, "restart") || !strings.Contains(body, err.Error()) {
		t.Fatalf("/healthz on a store that failed closed = %d %s, want 503 saying to restart, with the store's error", code, body)
	}
}

// With -shutdown-delay, a SIGTERM first turns /readyz to 503 while the
// proxy goes on serving new requests (load balancers are still sending
// them), and only then drains and stops.
func TestShutdownDelayKeepsServing(t *testing.T) {
	up := newUpstream(t)
	p := startInproc(t, "-upstream", up.URL, "-store", "memory", "-shutdown-delay", "3s")
	base := "http://" + p.admin
	stopped := make(chan error, 1)
	go func() { stopped <- p.stop() }()
	waitReadyz(t, base, http.StatusServiceUnavailable)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	got, err := post(t, c, p.proxy, "/orders", "after-sigterm", "x")
	if err != nil || got.status != http.StatusCreated {
		t.Fatalf("a new request during the shutdown delay: %d %v, want 201", got.status, err)
	}
	if n := up.ran("after-sigterm"); n != 1 {
		t.Fatalf("the upstream ran the request %d times, want 1", n)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

// A second SIGTERM during -shutdown-delay stops the proxy at once, as an
// operator who presses Ctrl-C twice expects, instead of being swallowed
// while the delay and then the drain run their course.
func TestSecondSignalStopsAtOnce(t *testing.T) {
	bin := binary(t)
	up := newUpstream(t)
	p := startProc(t, bin, "-upstream", up.URL, "-store", "memory", "-shutdown-delay", "5m")
	p.signal(t, syscall.SIGTERM)
	waitReadyz(t, "http://"+p.admin, http.StatusServiceUnavailable)
	p.signal(t, syscall.SIGTERM)
	p.wait(t, 20*time.Second)
}

// waitReadyz polls base's /readyz (bounded) until it answers want.
func waitReadyz(t *testing.T, base string, want int) {
	t.Helper()
	var r reply
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r = get(t, base+"/readyz")
		if r.status == want || time.Now().After(deadline) {
			break
		}
	}
	if r.status != want {
		t.Fatalf("/readyz = %d %q, want %d", r.status, r.body, want)
	}
}
