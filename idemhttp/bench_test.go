package idemhttp

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// The benchmarks compare the middleware with the bare handler in the same
// run (httptest.NewRecorder, MemoryStore). Two handlers: "static" writes a
// fixed JSON body (the middleware's overhead at its most visible), "json"
// decodes the request and encodes the answer like a typical API handler.
//
//	go test -run '^$' -bench . -benchmem -count 6 ./idemhttp/ | tee new.txt
//	benchstat new.txt

const benchBody = `{"amount":1999,"currency":"EUR","customer":"cus_8e03978e","note":"order 42"}`

type benchOrder struct {
	Amount   int    `json:"amount"`
	Currency string `json:"currency"`
	Customer string `json:"customer"`
	Note     string `json:"note"`
}

var benchHandlers = []struct {
	name string
	h    http.HandlerFunc
}{
	{"static", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"ord_42","status":"created"}`)
	}},
	{"json", func(w http.ResponseWriter, r *http.Request) {
		var o benchOrder
		if err := json.NewDecoder(r.Body).Decode(&o); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(struct {
			ID     string `json:"id"`
			Status string `json:"status"`
			Amount int    `json:"amount"`
		}{"ord_42", "created", o.Amount})
	}},
}

// rewindBody is a request body that can be rewound without allocating.
type rewindBody struct{ strings.Reader }

func (*rewindBody) Close() error { return nil }

func benchRequest() (*http.Request, *rewindBody, []string) {
	r := httptest.NewRequest(http.MethodPost, "/orders?expand=customer", nil)
	body := &rewindBody{}
	body.Reset(benchBody)
	r.Body = body
	r.ContentLength = int64(len(benchBody))
	r.Header.Set("Content-Type", "application/json")
	keys := []string{"k"}
	r.Header["Idempotency-Key"] = keys
	return r, body, keys
}

// benchGuard returns a Guard on a fresh MemoryStore with a clock that the
// benchmark moves forward by a third of the retention every quarter round
// (tick), so that records leave the window as new ones come in: the store
// stays under benchRound records, like a production window in steady state,
// instead of growing for as long as the benchmark runs (which would measure
// map growth, not the middleware). A key comes back after a full round,
// when its record has expired.
func benchGuard(b *testing.B) (g *idempotency.Guard, tick func(i int)) {
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	const retention = time.Hour
	g, err := idempotency.NewGuard(idempotency.NewMemoryStore(), &idempotency.Options{
		Retention: retention,
		Now:       func() time.Time { return time.Unix(0, clock.Load()) },
	})
	if err != nil {
		b.Fatal(err)
	}
	return g, func(i int) {
		if i%(benchRound/4) == 0 {
			clock.Add(int64(retention / 3))
		}
	}
}

func benchMiddleware(b *testing.B, g *idempotency.Guard, h http.Handler) http.Handler {
	m, err := New(g, nil)
	if err != nil {
		b.Fatal(err)
	}
	return m.Handler(h)
}

func BenchmarkBare(b *testing.B) {
	for _, bh := range benchHandlers {
		b.Run(bh.name, func(b *testing.B) {
			r, body, _ := benchRequest()
			b.ReportAllocs()
			for b.Loop() {
				body.Reset(benchBody)
				w := httptest.NewRecorder()
				bh.h.ServeHTTP(w, r)
				if w.Code != http.StatusCreated {
					b.Fatal(w.Code)
				}
			}
		})
	}
}

// benchRound is the number of distinct keys the new-key benchmarks cycle
// through, and about the number of records the store holds (see benchGuard).
const benchRound = 1 << 14

func BenchmarkNewKey(b *testing.B) {
	for _, bh := range benchHandlers {
		b.Run(bh.name, func(b *testing.B) {
			g, tick := benchGuard(b)
			h := benchMiddleware(b, g, bh.h)
			r, body, keys := benchRequest()
			// Keys are made before the timer starts, so that the loop
			// measures the middleware, not strconv.
			ids := make([]string, 0, benchRound)
			for i := range cap(ids) {
				ids = append(ids, "key-"+strconv.Itoa(i))
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				// Keys come round again only after benchRound requests,
				// when the clock has moved their records out of the window.
				tick(i)
				keys[0] = ids[i%len(ids)]
				i++
				body.Reset(benchBody)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code != http.StatusCreated || w.Header().Get(ReplayedHeader) != "" {
					b.Fatal(w.Code, w.Header())
				}
			}
		})
	}
}

func BenchmarkReplay(b *testing.B) {
	for _, bh := range benchHandlers {
		b.Run(bh.name, func(b *testing.B) {
			// The default clock: the record must stay in its window.
			g, err := idempotency.NewGuard(idempotency.NewMemoryStore(), nil)
			if err != nil {
				b.Fatal(err)
			}
			h := benchMiddleware(b, g, bh.h)
			r, body, _ := benchRequest()
			h.ServeHTTP(httptest.NewRecorder(), r)
			b.ReportAllocs()
			for b.Loop() {
				body.Reset(benchBody)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code != http.StatusCreated || w.Header().Get(ReplayedHeader) != "true" {
					b.Fatal(w.Code, w.Header())
				}
			}
		})
	}
}

// BenchmarkGuardRun is the floor under BenchmarkNewKey: Guard.Run on a
// MemoryStore with a new key and the response the static handler stores,
// without HTTP. The middleware's own cost is NewKey - Bare - GuardRun.
func BenchmarkGuardRun(b *testing.B) {
	ids := make([]string, 0, benchRound)
	for i := range cap(ids) {
		ids = append(ids, "\x00key-"+strconv.Itoa(i))
	}
	resp := idempotency.Response{Status: http.StatusCreated,
		Header: map[string][]string{"Content-Type": {"application/json"}},
		Body:   []byte(`{"id":"ord_42","status":"created"}`)}
	fn := func(context.Context) (idempotency.Response, error) { return resp, nil }
	g, tick := benchGuard(b)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tick(i)
		if r, err := g.Run(context.Background(), ids[i%len(ids)], "fp", fn); err != nil || r.Outcome != idempotency.Executed {
			b.Fatal(r.Outcome, err)
		}
		i++
	}
}

// BenchmarkFingerprint is the hashing part of the middleware's own cost:
// the canonical form and SHA-256 of the benchmark request, small and large
// bodies.
func BenchmarkFingerprint(b *testing.B) {
	for _, size := range []int{len(benchBody), 64 << 10} {
		b.Run(strconv.Itoa(size), func(b *testing.B) {
			f := newFingerprinter()
			r, _, _ := benchRequest()
			body := []byte(strings.Repeat(benchBody, size/len(benchBody)+1)[:size])
			buf := make([]byte, 0, 128)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				buf = f.appendFingerprint(buf[:0], r, []string{"Content-Type"}, body)
				if len(buf) != 2*sha256.Size {
					b.Fatal(len(buf))
				}
			}
		})
	}
}

// BenchmarkFloor measures the least work any middleware meeting the issue's
// rules must do per request, with nothing of this package in it: SHA-256
// over the request's canonical parts (method, path, query, Content-Type,
// body), then, for a new key, a record added to and found again in a map
// under a lock (the claim and the result), and for a replay one lookup. No
// clock read, no allocation, no response capture, no lease: a real store
// does more. Set against BenchmarkBare, it shows which of the ratios
// a middleware on this machine can reach at all (BENCHMARKS.md).
func BenchmarkFloor(b *testing.B) {
	keys := make([]string, 0, benchRound)
	for i := range cap(keys) {
		keys = append(keys, "\x00key-"+strconv.Itoa(i))
	}
	in := make([]byte, 0, 256)
	input := func() [sha256.Size]byte {
		in = append(in[:0], http.MethodPost...)
		in = append(in, "/orders\x00expand=customer\x00application/json\x00"...)
		in = append(in, benchBody...)
		return sha256.Sum256(in)
	}
	b.Run("newkey", func(b *testing.B) {
		var mu sync.Mutex
		recs := make(map[string][sha256.Size]byte, benchRound)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			fp := input()
			k := keys[i%len(keys)]
			mu.Lock()
			delete(recs, k) // the key's record from a round ago has expired
			recs[k] = fp
			mu.Unlock()
			mu.Lock()
			got, ok := recs[k]
			mu.Unlock()
			if !ok || got != fp {
				b.Fatal("lost")
			}
			i++
		}
	})
	b.Run("replay", func(b *testing.B) {
		var mu sync.Mutex
		recs := map[string][sha256.Size]byte{keys[0]: input()}
		b.ReportAllocs()
		for b.Loop() {
			fp := input()
			mu.Lock()
			got, ok := recs[keys[0]]
			mu.Unlock()
			if !ok || got != fp {
				b.Fatal("conflict")
			}
		}
	})
}
