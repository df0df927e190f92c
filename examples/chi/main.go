// Command chi serves an order API with chi and the idemhttp middleware:
// POST /orders runs once per Idempotency-Key, and retries get the first
// response back.
//
//	go run ./examples/chi -addr 127.0.0.1:8080
//	curl -i -X POST -H 'Idempotency-Key: "order-1"' -d '{"amount":5}' localhost:8080/orders
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemhttp"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// run serves until ctx is done. It reports the address it listens on.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("chi", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8080", "listen address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	router, err := newRouter(idempotency.NewMemoryStore())
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "listening on http://%s\n", ln.Addr())
	srv := &http.Server{Handler: router, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// newRouter is the whole integration: a Guard on a store, the middleware
// built from it, and r.Use in a group of the routes it guards. A top-level
// r.Use would also run for POSTs that match no route: their 404 (or 405)
// would be stored under the client's key, and the retry on the right path
// would get 422 for the whole window.
func newRouter(store idempotency.Store) (http.Handler, error) {
	guard, err := idempotency.NewGuard(store, nil)
	if err != nil {
		return nil, err
	}
	mw, err := idemhttp.New(guard, &idemhttp.Options{Required: true})
	if err != nil {
		return nil, err
	}
	var orders orderBook
	r := chi.NewRouter()
	r.Group(func(r chi.Router) {
		r.Use(mw.Handler) // Required: true, so a POST here without a key gets 400
		r.Post("/orders", orders.create)
	})
	r.Get("/orders/count", orders.count)
	return r, nil
}

// orderBook counts the orders created, so a retry that ran twice shows.
type orderBook struct{ n atomic.Int64 }

func (b *orderBook) create(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Amount int `json:"amount"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Amount <= 0 {
		http.Error(w, "want a JSON body with a positive amount", http.StatusBadRequest)
		return
	}
	id := b.n.Add(1)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]any{"id": id, "amount": in.Amount})
}

func (b *orderBook) count(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintln(w, b.n.Load())
}
