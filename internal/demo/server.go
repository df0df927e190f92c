package demo

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/faultstore"
	"github.com/archlab/idempotency/idemhttp"
	"github.com/archlab/idempotency/internal/storeurl"
)

// ServeCommand is the hidden subcommand under which a command re-executes
// itself as the demo's server (see Options.Command).
const ServeCommand = "serve-demo"

// errPaused is the cause of every store operation failed by /pause.
var errPaused = errors.New("demo: store paused by the control endpoint")

// order is the body of POST /orders. DelayMS makes the handler slow (a slow
// payment provider), to outlast the lease.
type order struct {
	SKU     string `json:"sku"`
	Qty     int    `json:"qty"`
	Cents   int    `json:"cents"`
	DelayMS int    `json:"delay_ms,omitempty"`
}

// receipt is the body of a 201. It is built from the ledger's row only, so a
// run that finds its key charged already answers the same bytes.
type receipt struct {
	Order    string `json:"order"`
	ChargeID string `json:"charge_id"`
	SKU      string `json:"sku"`
	Qty      int    `json:"qty"`
	Cents    int    `json:"cents"`
}

// Serve runs the demo's orders API until ctx is done or stdin reaches EOF
// (the campaign holds the other end, so the server does not outlive it). It
// prints one line "READY api=ADDR control=ADDR epoch=N" on stdout once both
// listeners accept connections.
func Serve(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(ServeCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "orders API address")
	control := fs.String("control", "127.0.0.1:0", "control address (store pause)")
	storeURL := fs.String("store", "", "idempotency store URL")
	ledgerPath := fs.String("ledger", "", "ledger bbolt file")
	stock := fs.Int("stock", 1_000_000, "initial stock of a new ledger")
	lease := fs.Duration("lease", time.Second, "Guard lease")
	unsafe := fs.Bool("unsafe", false, "serve without the idempotency middleware (a broken server, for tests)")
	verbose := fs.Bool("v", false, "log every guarded request")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *storeURL == "" || *ledgerPath == "" {
		return errors.New("serve-demo: -store and -ledger are required")
	}
	if stdin != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go func() {
			_, _ = io.Copy(io.Discard, stdin)
			cancel()
		}()
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))

	l, err := openLedger(*ledgerPath, *stock)
	if err != nil {
		return err
	}
	defer l.Close()
	openCtx, cancelOpen := context.WithTimeout(ctx, 30*time.Second)
	inner, closer, err := storeurl.Open(openCtx, *storeURL, storeurl.Options{Migrate: true, Logger: log})
	cancelOpen()
	if err != nil {
		return fmt.Errorf("serve-demo: open store: %w", err)
	}
	defer closer.Close()
	p := &pauser{}
	store := faultstore.New(inner, faultstore.InjectorFunc(p.maybeFault))

	api := http.Handler(ordersHandler(l, !*unsafe, log))
	if !*unsafe {
		guard, err := idempotency.NewGuard(store, &idempotency.Options{Lease: *lease, Retention: 30 * time.Minute})
		if err != nil {
			return err
		}
		opts := &idemhttp.Options{Required: true, Detach: true}
		if *verbose {
			opts.Observer = idemhttp.ObserverFunc(func(e idemhttp.Event) {
				log.Info("guarded", "key", e.Request.Header.Get("Idempotency-Key"), "outcome", e.Outcome,
					"status", e.Status, "latency", e.Latency, "err", e.Err)
			})
		}
		mw, err := idemhttp.New(guard, opts)
		if err != nil {
			return err
		}
		api = mw.Handler(api)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", api)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })

	cmux := http.NewServeMux()
	cmux.HandleFunc("POST /pause", func(w http.ResponseWriter, r *http.Request) {
		d, err := time.ParseDuration(r.URL.Query().Get("for"))
		if err != nil || d <= 0 || d > time.Minute {
			http.Error(w, "for: a duration up to 1m", http.StatusBadRequest)
			return
		}
		p.pause(d)
		log.Info("store paused", "for", d)
		fmt.Fprintf(w, "paused %v\n", d)
	})
	cmux.HandleFunc("GET /faults", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, store.InjectedTotal())
	})

	apiLn, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	ctlLn, err := net.Listen("tcp", *control)
	if err != nil {
		apiLn.Close()
		return err
	}
	apiSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ctlSrv := &http.Server{Handler: cmux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 2)
	go func() { errc <- apiSrv.Serve(apiLn) }()
	go func() { errc <- ctlSrv.Serve(ctlLn) }()
	fmt.Fprintf(stdout, "READY api=%s control=%s epoch=%d\n", apiLn.Addr(), ctlLn.Addr(), l.epoch)

	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	serr := errors.Join(apiSrv.Shutdown(shutCtx), ctlSrv.Shutdown(shutCtx))
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return errors.Join(err, serr)
}

// ordersHandler serves POST /orders: it reads the order, waits DelayMS and
// charges the ledger. Under the middleware (fenced) it makes the charge
// conditional on the key, as the package documents for side effects outside
// the store; the broken variant charges unconditionally.
func ordersHandler(l *ledger, fenced bool, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key, err := idemhttp.ParseKey(r.Header.Values("Idempotency-Key"))
		if err != nil {
			// Only the broken variant gets here with a malformed key.
			key = fmt.Sprint(r.Header.Values("Idempotency-Key"))
		}
		var o order
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&o); err != nil || o.SKU == "" || o.Qty <= 0 || o.Cents < 0 || o.DelayMS < 0 || o.DelayMS > 10_000 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid order"})
			return
		}
		if o.DelayMS > 0 {
			t := time.NewTimer(time.Duration(o.DelayMS) * time.Millisecond)
			select {
			case <-t.C:
			case <-r.Context().Done():
				// The lease was lost (or, unguarded, the client left):
				// nothing was charged; 503 is not stored and the retry
				// runs again.
				t.Stop()
				writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "aborted before charging"})
				return
			}
		}
		token, hasToken := idempotency.TokenFrom(r.Context())
		row, charged, err := l.charge(key, o.SKU, o.Qty, o.Cents, token, fenced && hasToken)
		switch {
		case errors.Is(err, errOutOfStock):
			writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"error": "OUT_OF_STOCK"})
			return
		case err != nil:
			log.Error("ledger", "key", key, "err", err)
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "ledger unavailable"})
			return
		}
		if !charged {
			log.Info("re-run found its charge", "key", key, "charge", row.ChargeID, "token", token)
		}
		writeJSON(w, http.StatusCreated, receipt{Order: row.Key, ChargeID: row.ChargeID, SKU: row.SKU, Qty: row.Qty, Cents: row.Cents})
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

// pauser makes every store operation hang, then fail, while a pause lasts:
// an operation started during the pause waits (up to 300ms, never past the
// pause) and fails with an error wrapping idempotency.ErrUnavailable.
type pauser struct {
	mu    sync.Mutex
	until time.Time
}

func (p *pauser) pause(d time.Duration) {
	p.mu.Lock()
	p.until = time.Now().Add(d)
	p.mu.Unlock()
}

func (p *pauser) maybeFault(faultstore.Op, string) faultstore.Fault {
	p.mu.Lock()
	left := time.Until(p.until)
	p.mu.Unlock()
	if left <= 0 {
		return nil
	}
	hang := min(left, 300*time.Millisecond)
	return faultstore.Chain(faultstore.Latency(1, hang, hang), faultstore.Error(errPaused))
}
