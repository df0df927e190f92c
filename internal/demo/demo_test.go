package demo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/faultstore"
	"github.com/archlab/idempotency/internal/testenv"
	"github.com/archlab/idempotency/internal/verdict"
)

// TestMain makes the test binary the demo's server when re-executed.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ServeCommand {
		if err := Serve(context.Background(), os.Args[2:], os.Stdin, os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestLedgerFence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	l, err := openLedger(path, 10)
	if err != nil {
		t.Fatal(err)
	}
	first, charged, err := l.charge("k1", "sku", 2, 100, 1, true)
	if err != nil || !charged {
		t.Fatalf("first charge: charged=%v err=%v", charged, err)
	}
	again, charged, err := l.charge("k1", "sku", 2, 100, 2, true)
	if err != nil || charged || again != first {
		t.Fatalf("fenced re-run: charged=%v row=%+v (first %+v) err=%v", charged, again, first, err)
	}
	for range 2 {
		if _, charged, err := l.charge("k2", "sku", 1, 50, 0, false); err != nil || !charged {
			t.Fatalf("unfenced charge: charged=%v err=%v", charged, err)
		}
	}
	if _, _, err := l.charge("k3", "sku", 100, 1, 1, true); !errors.Is(err, errOutOfStock) {
		t.Fatalf("charge beyond stock: %v", err)
	}
	l.Close()
	l, err = openLedger(path, 999) // a reopened ledger keeps its stock, starts epoch 2
	if err != nil {
		t.Fatal(err)
	}
	if l.epoch != 2 {
		t.Errorf("epoch after reopening = %d, want 2", l.epoch)
	}
	l.Close()
	st, err := readLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Initial != 10 || st.Stock != 6 || len(st.Charges) != 3 || len(st.Runs) != 4 ||
		st.Reservations["k1"] != 2 || st.Reservations["k2"] != 2 {
		t.Errorf("ledger = %+v; want initial 10, stock 6, 3 charges, 4 runs, k1:2 k2:2 reserved", st)
	}
}

func TestPauserFailsClosed(t *testing.T) {
	p := &pauser{}
	s := faultstore.New(idempotency.NewMemoryStore(), faultstore.InjectorFunc(p.maybeFault))
	ctx := context.Background()
	now := time.Now()
	if _, ok, err := s.Begin(ctx, "a", "f", now, time.Second, time.Minute); err != nil || !ok {
		t.Fatalf("before the pause: ok=%v err=%v", ok, err)
	}
	p.pause(2 * time.Second)
	start := time.Now()
	_, _, err := s.Begin(ctx, "b", "f", now, time.Second, time.Minute)
	if !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, errPaused) {
		t.Fatalf("during the pause: %v; want ErrUnavailable wrapping errPaused", err)
	}
	if waited := time.Since(start); waited < 250*time.Millisecond {
		t.Errorf("a paused operation failed after %v; it should hang first", waited)
	}
	if _, err := s.Unwrap().Get(ctx, "b", now); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("a paused Begin reached the store: %v", err)
	}
	p.pause(0)
	if _, ok, err := s.Begin(ctx, "b", "f", now, time.Second, time.Minute); err != nil || !ok {
		t.Fatalf("after the pause: ok=%v err=%v", ok, err)
	}
}

// TestCampaignOnServices runs a short campaign with the server on Redis and
// on PostgreSQL.
func TestCampaignOnServices(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	for _, tc := range []struct {
		name string
		url  func(t *testing.T) string
	}{
		{"redis", func(t *testing.T) string { return testenv.RedisStoreURL(t, "demo-test-") }},
		{"postgres", func(t *testing.T) string {
			u, _ := testenv.PostgresStoreURL(t, "demo_test_")
			return u
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := tc.url(t)
			exe, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			rep := verdict.New()
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			var events []string
			err = Run(ctx, Options{Seed: 5, Duration: 3 * time.Second, StoreURL: url, Dir: t.TempDir(),
				Command: []string{exe, ServeCommand},
				Log:     func(f string, a ...any) { events = append(events, fmt.Sprintf(f, a...)) }}, rep)
			var b strings.Builder
			rep.Write(&b)
			if err != nil {
				t.Fatalf("campaign: %v\n%s", err, b.String())
			}
			if !rep.OK() {
				t.Fatalf("campaign on %s failed:\n%s", tc.name, b.String())
			}
			for _, c := range rep.Checks() {
				if !c.OK() {
					t.Errorf("check %q not proven: %+v", c.Name, c)
				}
			}
			if len(events) != 2 {
				t.Errorf("events = %q; want a pause and a kill", events)
			}
			t.Logf("%s\n%s", strings.Join(events, "\n"), b.String())
		})
	}
}
