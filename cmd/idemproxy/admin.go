package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemhttp"
)

// adminHandler serves the operator endpoints:
//
//	GET    /healthz                  the process is up (503 once the store failed closed: restart it)
//	GET    /readyz                   the store takes a write (503 otherwise, and once shutting down)
//	GET    /metrics                  Prometheus metrics
//	GET    /keys/{key}?scope=S       the record of a key (404 if none)
//	DELETE /keys/{key}?scope=S       evict a key in any state (404 if none)
//	POST   /keys/{key}/release?scope=S[&force=true]  give an in-flight claim back
//
// {key} is the client's Idempotency-Key, quoted or bare as in the header
// (URL-escaped), and S the scope the proxy derived
// for the request (see -scope-header); storeKey (idemhttp.StoreKey) joins them as the
// middleware does. A claim whose request this process is still running
// upstream (run) is released only with force=true. The admin address must
// not be exposed to clients.
//
// The readiness probe writes to probe (the store itself, so that probes do
// not show in the store metrics), the rest to store.
func adminHandler(store, probe idempotency.Store, m *metrics, storeKey func(scope, key string) string, now func() time.Time,
	run *runningSet, draining *atomic.Bool) http.Handler {
	mux := http.NewServeMux()
	// A store that failed closed (boltstore, after a failed commit left it
	// unsure of what the disk holds) answers nothing until it is reopened:
	// unlike a store that cannot be reached, waiting does not mend it, a
	// restart does, so the liveness probe fails.
	failed, _ := probe.(interface{ Failed() error })
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if failed != nil {
			if err := failed.Failed(); err != nil {
				writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "store failed closed: restart the process", "error": err.Error()})
				return
			}
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	// The probe claims and releases a key, as a guarded request does: a
	// store that still reads but refuses writes (out of memory, a replica
	// or standby after a failover) answers every request 503. The key is
	// new each time, since Redis lets a script that found a record (a
	// release's tombstone) write on past maxmemory; it holds no NUL, so no
	// request's key (scope, NUL, key) is ever it.
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if draining != nil && draining.Load() {
			// SIGTERM: the proxy no longer accepts requests.
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "shutting down"})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		probeKey := "idemproxy-readiness-probe:" + rand.Text()
		rec, claimed, err := probe.Begin(ctx, probeKey, "readyz", now(), 10*time.Second, time.Minute)
		if err == nil && claimed {
			err = probe.Release(ctx, probeKey, rec.Token)
		}
		if err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "store unavailable", "error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	// keyOf is the stored key a request names: {key} is read like the
	// Idempotency-Key header, so "order-42" quoted and order-42 bare are
	// one key. A malformed key gets 400.
	keyOf := func(w http.ResponseWriter, r *http.Request) (string, bool) {
		k, err := idemhttp.ParseKey([]string{r.PathValue("key")})
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return "", false
		}
		return storeKey(r.URL.Query().Get("scope"), k), true
	}
	mux.HandleFunc("GET /keys/{key}", func(w http.ResponseWriter, r *http.Request) {
		k, ok := keyOf(w, r)
		if !ok {
			return
		}
		rec, err := store.Get(r.Context(), k, now())
		if err != nil {
			writeStoreError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, recordView(rec))
	})
	mux.HandleFunc("DELETE /keys/{key}", func(w http.ResponseWriter, r *http.Request) {
		k, ok := keyOf(w, r)
		if !ok {
			return
		}
		if err := deleteKey(r.Context(), store, k, now()); err != nil {
			writeStoreError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "deleted"})
	})
	mux.HandleFunc("POST /keys/{key}/release", func(w http.ResponseWriter, r *http.Request) {
		k, ok := keyOf(w, r)
		if !ok {
			return
		}
		if err := releaseKey(r.Context(), store, k, now(), run, r.URL.Query().Get("force") == "true"); err != nil {
			writeStoreError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "released"})
	})
	return mux
}

// releaseKey gives back the current claim of an in-flight key. A key that
// is done cannot be released (delete it instead). Unless force is set, nor
// can a claim whose request run (nil: none) says is still under way here:
// a retry would run the operation again beside it, and the running one
// would lose its lease and have its upstream call cancelled mid-flight.
func releaseKey(ctx context.Context, store idempotency.Store, key string, now time.Time, run *runningSet, force bool) error {
	rec, err := store.Get(ctx, key, now)
	if err != nil {
		return err
	}
	if rec.State != idempotency.Processing {
		return errNotInFlight
	}
	if !force && run.has(key, rec.Token) {
		return errRunningHere
	}
	return store.Release(ctx, key, rec.Token)
}

// deleteKey evicts key, or returns ErrNotFound if it has no live record
// (a mistyped key or scope must not look evicted).
func deleteKey(ctx context.Context, store idempotency.Store, key string, now time.Time) error {
	if _, err := store.Get(ctx, key, now); errors.Is(err, idempotency.ErrNotFound) {
		return err
	}
	// Any other answer goes on to Delete, errors included: a record that no
	// longer decodes fails every request on its key, and evicting it is
	// what delete is for.
	return store.Delete(ctx, key)
}

var (
	errNotInFlight = errors.New("key is not in flight (use delete to evict a stored result)")
	errRunningHere = errors.New("the key's request is still running upstream in this proxy; " +
		"releasing it lets a retry run it again meanwhile (add ?force=true to release anyway)")
)

// runningSet holds the guarded requests this process is running upstream
// now, with their claims' fencing tokens, in shards by token so that
// requests do not all meet at one lock. Tracking costs a map insert and
// delete per request; the stored key is worked out only when an operator
// asks (has), from the few requests whose token matches.
type runningSet struct {
	scope  func(*http.Request) string
	shards [32]runningShard
}

type runningShard struct {
	mu sync.Mutex
	m  map[*http.Request]uint64
}

func newRunningSet(scope func(*http.Request) string) *runningSet {
	s := &runningSet{scope: scope}
	for i := range s.shards {
		s.shards[i].m = make(map[*http.Request]uint64)
	}
	return s
}

func (s *runningSet) shard(token uint64) *runningShard { return &s.shards[token%uint64(len(s.shards))] }

// track returns next recording each guarded request (one that the
// middleware runs with a fencing token) while it runs.
func (s *runningSet) track(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := idempotency.TokenFrom(r.Context())
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		sh := s.shard(token)
		sh.mu.Lock()
		sh.m[r] = token
		sh.mu.Unlock()
		defer func() {
			sh.mu.Lock()
			delete(sh.m, r)
			sh.mu.Unlock()
		}()
		next.ServeHTTP(w, r)
	})
}

// has reports whether the claim of key with token is running here.
func (s *runningSet) has(key string, token uint64) bool {
	if s == nil {
		return false
	}
	sh := s.shard(token)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for r, t := range sh.m {
		if t != token {
			continue
		}
		// The request's header is only read, here as by the proxy (which
		// sends a clone).
		if k, err := idemhttp.ParseKey(r.Header["Idempotency-Key"]); err == nil && idemhttp.StoreKey(s.scope(r), k) == key {
			return true
		}
	}
	return false
}

type recordJSON struct {
	State       idempotency.State `json:"state"`
	Fingerprint string            `json:"fingerprint"`
	Token       uint64            `json:"token"`
	LeaseUntil  *time.Time        `json:"lease_until,omitempty"`
	ExpiresAt   time.Time         `json:"expires_at"`
	Status      int               `json:"status,omitempty"`
	BodyBytes   int               `json:"body_bytes,omitempty"`
}

// recordView shows a record without its body: bodies may hold personal data.
func recordView(rec idempotency.Record) recordJSON {
	v := recordJSON{State: rec.State, Fingerprint: rec.Fingerprint, Token: rec.Token, ExpiresAt: rec.ExpiresAt,
		Status: rec.Response.Status, BodyBytes: len(rec.Response.Body)}
	if !rec.LeaseUntil.IsZero() {
		v.LeaseUntil = &rec.LeaseUntil
	}
	return v
}

func writeStoreError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, idempotency.ErrNotFound):
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no live record for this key"})
	case errors.Is(err, errNotInFlight), errors.Is(err, errRunningHere):
		writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
	case errors.Is(err, idempotency.ErrLeaseLost):
		writeJSON(w, http.StatusConflict, map[string]string{"error": "the claim changed meanwhile; look again"})
	default:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
