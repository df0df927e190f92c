package main

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemhttp"
)

// metrics are the proxy's Prometheus metrics, on a registry of its own.
type metrics struct {
	reg        *prometheus.Registry
	requests   *prometheus.CounterVec   // by outcome
	latency    *prometheus.HistogramVec // request latency by outcome
	storeOps   *prometheus.HistogramVec // store latency by operation
	storeErrs  *prometheus.CounterVec   // store errors by operation
	renewals   *prometheus.CounterVec   // lease renewals by result
	leaseLost  prometheus.Counter
	inFlight   prometheus.Gauge
	passedThru prometheus.Counter

	// The series of every known outcome and store operation, made at
	// start: they are exported (as 0) before the first request, and a
	// request looks its own up in a map instead of hashing label values.
	outcomes map[idemhttp.Outcome]outcomeSeries
	ops      map[string]opSeries
}

type outcomeSeries struct {
	requests prometheus.Counter
	latency  prometheus.Observer
}

type opSeries struct {
	latency prometheus.Observer
	errs    prometheus.Counter
}

// knownOutcomes and storeOpNames are the label values made at start.
var (
	knownOutcomes = []idemhttp.Outcome{idemhttp.Executed, idemhttp.Replayed, idemhttp.InFlight, idemhttp.Conflict,
		idemhttp.Unavailable, idemhttp.LeaseLost, idemhttp.Released, idemhttp.Abandoned, idemhttp.NotStored,
		idemhttp.NotReplayable, idemhttp.BadRequest, idemhttp.TooLarge}
	storeOpNames = []string{"begin", "complete", "extend", "release", "get", "delete"}
)

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_requests_total",
			Help: "Guarded requests by outcome (executed, replayed, in_flight, conflict, unavailable, lease_lost, released, ...).",
		}, []string{"outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemproxy_request_duration_seconds",
			Help:    "Time spent on guarded requests, upstream included, by outcome.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 12),
		}, []string{"outcome"}),
		storeOps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemproxy_store_duration_seconds",
			Help:    "Latency of idempotency store operations.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 12),
		}, []string{"op"}),
		storeErrs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_store_errors_total",
			Help: "Store operations that failed with ErrUnavailable (the store could not answer).",
		}, []string{"op"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_lease_renewals_total",
			Help: "Lease renewals while the upstream runs, by result (ok, lost, error).",
		}, []string{"result"}),
		leaseLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemproxy_lease_lost_total",
			Help: "Requests whose response was sent but not stored because another holder took the key over.",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemproxy_requests_in_flight",
			Help: "Requests being served now.",
		}),
		passedThru: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemproxy_requests_unguarded_total",
			Help: "Requests passed through without a key or with an unguarded method.",
		}),
	}
	m.reg.MustRegister(m.requests, m.latency, m.storeOps, m.storeErrs, m.renewals, m.leaseLost, m.inFlight, m.passedThru,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.outcomes = make(map[idemhttp.Outcome]outcomeSeries, len(knownOutcomes))
	for _, o := range knownOutcomes {
		m.outcomes[o] = outcomeSeries{m.requests.WithLabelValues(string(o)), m.latency.WithLabelValues(string(o))}
	}
	m.ops = make(map[string]opSeries, len(storeOpNames))
	for _, op := range storeOpNames {
		m.ops[op] = opSeries{m.storeOps.WithLabelValues(op), m.storeErrs.WithLabelValues(op)}
	}
	for _, r := range []string{"ok", "lost", "error"} {
		m.renewals.WithLabelValues(r)
	}
	return m
}

// Observe implements idemhttp.Observer.
func (m *metrics) Observe(e idemhttp.Event) {
	os, ok := m.outcomes[e.Outcome]
	if !ok {
		o := string(e.Outcome)
		os = outcomeSeries{m.requests.WithLabelValues(o), m.latency.WithLabelValues(o)}
	}
	os.requests.Inc()
	os.latency.Observe(e.Latency.Seconds())
	if e.Outcome == idemhttp.LeaseLost {
		m.leaseLost.Inc()
	}
}

func (m *metrics) onRenew(_ string, err error) {
	switch {
	case err == nil:
		m.renewals.WithLabelValues("ok").Inc()
	case errors.Is(err, idempotency.ErrLeaseLost):
		m.renewals.WithLabelValues("lost").Inc()
	default:
		m.renewals.WithLabelValues("error").Inc()
	}
}

// countInFlight wraps the whole proxy handler.
func (m *metrics) countInFlight(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.inFlight.Inc()
		defer m.inFlight.Dec()
		h.ServeHTTP(w, r)
	})
}

// timedStore measures every store operation.
type timedStore struct {
	idempotency.Store
	m *metrics
}

func (s timedStore) observe(op string, start time.Time, err error) {
	os, ok := s.m.ops[op]
	if !ok {
		os = opSeries{s.m.storeOps.WithLabelValues(op), s.m.storeErrs.WithLabelValues(op)}
	}
	os.latency.Observe(time.Since(start).Seconds())
	if err != nil && errors.Is(err, idempotency.ErrUnavailable) {
		os.errs.Inc()
	}
}

func (s timedStore) Begin(ctx context.Context, key, fp string, now time.Time, lease, retention time.Duration) (idempotency.Record, bool, error) {
	start := time.Now()
	rec, ok, err := s.Store.Begin(ctx, key, fp, now, lease, retention)
	s.observe("begin", start, err)
	return rec, ok, err
}

func (s timedStore) Complete(ctx context.Context, key string, token uint64, resp idempotency.Response, now time.Time, retention time.Duration) error {
	start := time.Now()
	err := s.Store.Complete(ctx, key, token, resp, now, retention)
	s.observe("complete", start, err)
	return err
}

func (s timedStore) Extend(ctx context.Context, key string, token uint64, now time.Time, lease time.Duration) error {
	start := time.Now()
	err := s.Store.Extend(ctx, key, token, now, lease)
	s.observe("extend", start, err)
	return err
}

func (s timedStore) Release(ctx context.Context, key string, token uint64) error {
	start := time.Now()
	err := s.Store.Release(ctx, key, token)
	s.observe("release", start, err)
	return err
}

func (s timedStore) Get(ctx context.Context, key string, now time.Time) (idempotency.Record, error) {
	start := time.Now()
	rec, err := s.Store.Get(ctx, key, now)
	s.observe("get", start, err)
	return rec, err
}

func (s timedStore) Delete(ctx context.Context, key string) error {
	start := time.Now()
	err := s.Store.Delete(ctx, key)
	s.observe("delete", start, err)
	return err
}

// watchCache exports the replay cache's counters, read when scraped.
func (m *metrics) watchCache(c *idempotency.ReplayCache) {
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_replay_cache_hits_total",
			Help: "Replays answered from the replay cache, without asking the store.",
		}, func() float64 { return float64(c.Stats().Hits) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_replay_cache_bytes",
			Help: "Memory held by the replay cache (keys, fingerprints, bodies, headers).",
		}, func() float64 { return float64(c.Stats().Bytes) }),
	)
}
