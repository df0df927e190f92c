// Command benchupstream is the fixed side of scripts/bench-proxy.sh: a tiny,
// fast HTTP service to put proxies in front of, and, with -proxy, the
// baseline those proxies are measured against, a plain
// net/http/httputil.ReverseProxy with the same transport settings and
// buffer pool as idemproxy's, so that the ratio measures what idempotency
// costs and nothing else.
//
//	benchupstream -listen 127.0.0.1:9000                                   # the service
//	benchupstream -listen 127.0.0.1:9001 -proxy http://127.0.0.1:9000      # the plain proxy
//
// The service reads the request body and answers 201 with a small JSON body
// that echoes its size, like an API creating a resource; with -delay it
// waits that long first.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "address to serve on")
	proxy := flag.String("proxy", "", "if set, be a plain reverse proxy to this URL instead of the service")
	delay := flag.Duration("delay", 0, "the service waits this long before answering, as an API waiting on its database does (0: answers at once)")
	flag.Parse()
	var h http.Handler
	if *proxy != "" {
		up, err := url.Parse(*proxy)
		if err != nil || up.Host == "" {
			log.Fatalf("benchupstream: -proxy %q is not a URL", *proxy)
		}
		h = plainProxy(up)
	} else {
		h = service(*delay)
	}
	srv := &http.Server{Addr: *listen, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "benchupstream:", err)
		os.Exit(1)
	}
}

// plainProxy is what idemproxy is compared with: the stdlib reverse proxy,
// configured as idemproxy configures its own (see cmd/idemproxy/proxy.go).
func plainProxy(up *url.URL) http.Handler {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = 256
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			pr.SetXForwarded()
		},
		Transport:  transport,
		BufferPool: &bufferPool{},
		// wrk drops its connections with requests under way when a run
		// ends; those cancellations are not worth a line each.
		ErrorLog: log.New(io.Discard, "", 0),
	}
}

// bufferPool recycles ReverseProxy's 32 KiB copy buffers, as idemproxy does.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 32<<10)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }

func service(delay time.Duration) http.Handler {
	var seq atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		if delay > 0 {
			time.Sleep(delay)
		}
		id := seq.Add(1)
		b := make([]byte, 0, 64)
		b = append(b, `{"id":`...)
		b = strconv.AppendInt(b, id, 10)
		b = append(b, `,"received":`...)
		b = strconv.AppendInt(b, n, 10)
		b = append(b, "}\n"...)
		h := w.Header()
		h["Content-Type"] = []string{"application/json"}
		h["Content-Length"] = []string{strconv.Itoa(len(b))}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(b)
	})
}
