//go:build pprof

// Profiling builds: go build -tags pprof ./cmd/idemproxy, then run with
// IDEMPROXY_PPROF=127.0.0.1:6060 and fetch
// http://127.0.0.1:6060/debug/pprof/profile?seconds=10 while the proxy is
// under load (scripts/bench-proxy.sh sets this up with BENCH_PPROF). The
// tag keeps net/http/pprof, and its handlers on http.DefaultServeMux, out
// of the binaries that are shipped.

package main

import (
	"log"
	"net/http"
	_ "net/http/pprof"
	"os"
)

func init() {
	addr := os.Getenv("IDEMPROXY_PPROF")
	if addr == "" {
		return
	}
	go func() { log.Println("pprof:", http.ListenAndServe(addr, nil)) }()
}
