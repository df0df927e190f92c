package idemhttp

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/archlab/idempotency"
)

// The Server benchmarks send each request over a keep-alive loopback
// connection to an httptest.NewServer, one at a time, as a client would:
// the bare handler against the same handler behind the middleware, in the
// same run. They measure what a caller sees; the recorder benchmarks in
// bench_test.go isolate the middleware's own CPU cost.
//
//	go test -run '^$' -bench Server -benchmem -count 6 ./idemhttp/ | tee server.txt
//	benchstat -col /path server.txt

func benchServer(b *testing.B, h http.Handler) (*http.Client, string) {
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)
	tr := &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}
	b.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}, srv.URL + "/orders?expand=customer"
}

// benchPost sends one POST with key (none if empty) and checks the answer.
func benchPost(b *testing.B, c *http.Client, url, key string, body *strings.Reader, replayed string) {
	body.Reset(benchBody)
	req, err := http.NewRequest(http.MethodPost, url, body)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header["Idempotency-Key"] = []string{key}
	}
	resp, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || resp.Header.Get(ReplayedHeader) != replayed {
		b.Fatalf("status %d, %s=%q, want 201 and %q", resp.StatusCode, ReplayedHeader, resp.Header.Get(ReplayedHeader), replayed)
	}
}

func BenchmarkServer(b *testing.B) {
	for _, bh := range benchHandlers {
		b.Run("handler="+bh.name+"/path=bare", func(b *testing.B) {
			c, url := benchServer(b, bh.h)
			body := strings.NewReader(benchBody)
			b.ReportAllocs()
			for b.Loop() {
				benchPost(b, c, url, "", body, "")
			}
		})
		b.Run("handler="+bh.name+"/path=newkey", func(b *testing.B) {
			g, tick := benchGuard(b)
			c, url := benchServer(b, benchMiddleware(b, g, bh.h))
			ids := make([]string, 0, benchRound)
			for i := range cap(ids) {
				ids = append(ids, "key-"+strconv.Itoa(i))
			}
			body := strings.NewReader(benchBody)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				tick(i)
				benchPost(b, c, url, ids[i%len(ids)], body, "")
				i++
			}
		})
		b.Run("handler="+bh.name+"/path=replay", func(b *testing.B) {
			g, err := idempotency.NewGuard(idempotency.NewMemoryStore(), nil)
			if err != nil {
				b.Fatal(err)
			}
			c, url := benchServer(b, benchMiddleware(b, g, bh.h))
			body := strings.NewReader(benchBody)
			benchPost(b, c, url, "k", body, "")
			b.ReportAllocs()
			for b.Loop() {
				benchPost(b, c, url, "k", body, "true")
			}
		})
	}
}
