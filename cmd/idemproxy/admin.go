package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemhttp"
)

// adminHandler serves the operator endpoints:
//
//	GET    /healthz                  the process is up
//	GET    /readyz                   the store answers (503 otherwise)
//	GET    /metrics                  Prometheus metrics
//	GET    /keys/{key}?scope=S       the record of a key (404 if none)
//	DELETE /keys/{key}?scope=S       evict a key in any state
//	POST   /keys/{key}/release?scope=S  give an in-flight claim back
//
// {key} is the client's Idempotency-Key, quoted or bare as in the header
// (URL-escaped), and S the scope the proxy derived
// for the request (see -scope-header); storeKey (idemhttp.StoreKey) joins them as the
// middleware does. The admin address must not be exposed to clients.
func adminHandler(store idempotency.Store, m *metrics, storeKey func(scope, key string) string, now func() time.Time) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		_, err := store.Get(ctx, "idemproxy-readiness-probe", now())
		if err != nil && !errors.Is(err, idempotency.ErrNotFound) {
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
		if err := store.Delete(r.Context(), k); err != nil {
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
		if err := releaseKey(r.Context(), store, k, now()); err != nil {
			writeStoreError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "released"})
	})
	return mux
}

// releaseKey gives back the current claim of an in-flight key. A key that
// is done cannot be released (delete it instead).
func releaseKey(ctx context.Context, store idempotency.Store, key string, now time.Time) error {
	rec, err := store.Get(ctx, key, now)
	if err != nil {
		return err
	}
	if rec.State != idempotency.Processing {
		return errNotInFlight
	}
	return store.Release(ctx, key, rec.Token)
}

var errNotInFlight = errors.New("key is not in flight (use delete to evict a stored result)")

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
	case errors.Is(err, errNotInFlight):
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
