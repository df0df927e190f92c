package idemhttp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemhttp"
)

func Example() {
	guard, _ := idempotency.NewGuard(idempotency.NewMemoryStore(), nil)
	mw, err := idemhttp.New(guard, &idemhttp.Options{Required: true})
	if err != nil {
		panic(err)
	}
	charges := 0
	mux := http.NewServeMux()
	mux.Handle("POST /charges", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charge %d", charges)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Idempotency-Key", `"9f1c2d"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d %s replayed=%q\n", resp.StatusCode, body, resp.Header.Get("Idempotent-Replayed"))
	}
	// Output:
	// 201 charge 1 replayed=""
	// 201 charge 1 replayed="true"
}
