package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemhttp"
)

func post(t *testing.T, url, key, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/orders", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func count(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/orders/count")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b))
}

func TestChiRouterRunsOncePerKey(t *testing.T) {
	router, err := newRouter(idempotency.NewMemoryStore())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(router)
	defer srv.Close()

	first, body1 := post(t, srv.URL, `"order-1"`, `{"amount":5}`)
	retry, body2 := post(t, srv.URL, `order-1`, `{"amount":5}`)
	if first.StatusCode != http.StatusCreated || retry.StatusCode != http.StatusCreated {
		t.Fatalf("statuses %d, %d", first.StatusCode, retry.StatusCode)
	}
	if body1 != body2 || retry.Header.Get(idemhttp.ReplayedHeader) != "true" || retry.Header.Get("Location") != "/orders/1" {
		t.Fatalf("retry was not a replay: %v %q", retry.Header, body2)
	}
	if n := count(t, srv.URL); n != "1" {
		t.Fatalf("%s orders created, want 1", n)
	}
	if resp, _ := post(t, srv.URL, `"order-1"`, `{"amount":6}`); resp.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("reused key with another body: %d", resp.StatusCode)
	}
	if resp, _ := post(t, srv.URL, "", `{"amount":5}`); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("missing key: %d", resp.StatusCode)
	}
	if n := count(t, srv.URL); n != "1" {
		t.Fatalf("%s orders created, want 1", n)
	}
}

func TestRunServesAndStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{"-addr", "127.0.0.1:0"}, pw, io.Discard)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, pr)
	url := strings.TrimSpace(strings.TrimPrefix(line, "listening on "))
	if resp, _ := post(t, url, "k", `{"amount":1}`); resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d", resp.StatusCode)
	}
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not stop")
	}
}

// A POST to a path the router does not serve must not reach the middleware:
// its 404 would be stored under the key, and the client's retry on the
// right path would get 422 instead of running.
func TestUnknownPathDoesNotUseTheKey(t *testing.T) {
	router, err := newRouter(idempotency.NewMemoryStore())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(router)
	defer srv.Close()

	req, err := http.NewRequest(http.MethodPost, srv.URL+"/order", strings.NewReader(`{"amount":5}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", `"order-9"`)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("POST /order: %d, want 404", resp.StatusCode)
	}
	if got := resp.Header.Get(idemhttp.DefaultWindowHeader); got != "" {
		t.Errorf("404 advertises a window (%s: %s): it was stored under the key", idemhttp.DefaultWindowHeader, got)
	}
	if resp, body := post(t, srv.URL, `"order-9"`, `{"amount":5}`); resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /orders after the typo: %d %s, want 201", resp.StatusCode, body)
	}
}
