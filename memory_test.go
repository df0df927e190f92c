package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

var memBase = time.Date(2026, 10, 19, 4, 0, 0, 0, time.UTC)

// TestMemoryReclaimsExpired: with no janitor and no timer, writes reclaim
// expired records, so the store holds about one window of records however
// long it runs.
func TestMemoryReclaimsExpired(t *testing.T) {
	s := idempotency.NewMemoryStore()
	ctx := context.Background()
	const (
		perSecond = 10
		window    = 60 * time.Second
		seconds   = 600
		live      = perSecond * 60
	)
	maxLen := 0
	for sec := range seconds {
		now := memBase.Add(time.Duration(sec) * time.Second)
		for i := range perSecond {
			key := fmt.Sprintf("k%d-%d", sec, i)
			rec, ok, err := s.Begin(ctx, key, "fp", now, time.Second, window)
			if err != nil || !ok {
				t.Fatalf("Begin(%s) = %v, %v", key, ok, err)
			}
			if i%2 == 0 { // half are completed, half left Processing to expire
				if err := s.Complete(ctx, key, rec.Token, idempotency.Response{Status: 200}, now, window); err != nil {
					t.Fatalf("Complete(%s): %v", key, err)
				}
			}
		}
		maxLen = max(maxLen, s.Len())
	}
	// 60 seconds of records are live; what is held beyond that is a backlog
	// of expired records that writes have not reached yet.
	if maxLen > 2*live {
		t.Errorf("Len reached %d over %d s of writes; the live window holds %d records, so expired ones are not reclaimed", maxLen, seconds, live)
	}
	end := memBase.Add(seconds * time.Second)
	if got := len(s.Keys(end)); got > live || got < live-perSecond {
		t.Errorf("Keys at the end: %d live records, want about %d", got, live)
	}
	t.Logf("Len peaked at %d for a live window of %d records", maxLen, live)
}

// TestMemoryReclaimsAfterBurst: a burst that has expired is reclaimed by the
// writes that follow it, down to exactly the live records.
func TestMemoryReclaimsAfterBurst(t *testing.T) {
	s := idempotency.NewMemoryStore()
	ctx := context.Background()
	for i := range 1000 {
		if _, _, err := s.Begin(ctx, fmt.Sprintf("burst-%d", i), "fp", memBase, time.Second, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.Len(); got != 1000 {
		t.Fatalf("Len after the burst = %d, want 1000", got)
	}
	later := memBase.Add(2 * time.Minute)
	if got := s.Keys(later); len(got) != 0 {
		t.Fatalf("Keys after the window = %d keys, want none", len(got))
	}
	prev := s.Len()
	for i := range 2000 {
		if _, _, err := s.Begin(ctx, fmt.Sprintf("after-%d", i), "fp", later, time.Second, time.Hour); err != nil {
			t.Fatal(err)
		}
		if i%100 == 99 {
			if l := s.Len(); l-prev > 100 {
				t.Fatalf("Len grew from %d to %d over 100 writes while expired records were waiting", prev, l)
			}
			prev = s.Len()
		}
	}
	if got := s.Len(); got != 2000 {
		t.Errorf("Len = %d after 2000 writes past the burst's window, want 2000 (the burst reclaimed)", got)
	}
}

func TestMemoryMaxRecords(t *testing.T) {
	const max = 10
	s, err := idempotency.NewMemoryStoreWith(&idempotency.MemoryOptions{MaxRecords: max})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tokens := map[string]uint64{}
	for i := range max {
		key := fmt.Sprintf("k%d", i)
		rec, ok, err := s.Begin(ctx, key, "fp", memBase, time.Second, time.Minute)
		if err != nil || !ok {
			t.Fatalf("Begin(%s) = %v, %v", key, ok, err)
		}
		tokens[key] = rec.Token
	}

	// Full of live records: a new key fails closed, no live record is evicted.
	if _, _, err := s.Begin(ctx, "one-too-many", "fp", memBase.Add(time.Second), time.Second, time.Minute); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Begin on a full store = %v, want ErrUnavailable", err)
	}
	if got := s.Keys(memBase); len(got) != max {
		t.Fatalf("live keys after the refused Begin = %v, want all %d kept", got, max)
	}
	// Existing keys still answer, and a lease past its end is taken over.
	if _, ok, err := s.Begin(ctx, "k0", "fp", memBase.Add(2*time.Second), time.Second, time.Minute); err != nil || !ok {
		t.Fatalf("takeover of an existing key on a full store = %v, %v; want a claim", ok, err)
	}
	g := &idempotency.Guard{Store: s, Lease: time.Second, Retention: time.Minute, RenewEvery: -1,
		Now: func() time.Time { return memBase.Add(3 * time.Second) }}
	ran := false
	_, out, err := g.Do(ctx, "guarded", "fp", func(context.Context) (idempotency.Response, error) {
		ran = true
		return idempotency.Response{}, nil
	})
	if ran || out != idempotency.Unavailable || !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Guard.Do on a full store: ran %v, %s, %v; want fn not run, %s", ran, out, err, idempotency.Unavailable)
	}

	// Release frees a slot at once.
	if err := s.Release(ctx, "k1", tokens["k1"]); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Begin(ctx, "after-release", "fp", memBase.Add(time.Second), time.Second, time.Minute); err != nil || !ok {
		t.Fatalf("Begin after a Release on a full store = %v, %v; want a claim", ok, err)
	}
	// So does Delete.
	if err := s.Delete(ctx, "k2"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Begin(ctx, "after-delete", "fp", memBase.Add(time.Second), time.Second, time.Minute); err != nil || !ok {
		t.Fatalf("Begin after a Delete on a full store = %v, %v; want a claim", ok, err)
	}
	if _, _, err := s.Begin(ctx, "still-full", "fp", memBase.Add(time.Second), time.Second, time.Minute); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Begin on a full store = %v, want ErrUnavailable", err)
	}

	// Once the window has passed, expired records make room for new ones.
	later := memBase.Add(2 * time.Minute)
	for i := range max {
		key := fmt.Sprintf("new%d", i)
		if _, ok, err := s.Begin(ctx, key, "fp", later, time.Second, time.Minute); err != nil || !ok {
			t.Fatalf("Begin(%s) after the window = %v, %v; want a claim (expired records reclaimed)", key, ok, err)
		}
	}
	if got := s.Len(); got != max {
		t.Errorf("Len = %d, want %d", got, max)
	}
	if _, _, err := s.Begin(ctx, "new-too-many", "fp", later, time.Second, time.Minute); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Begin on a store full again = %v, want ErrUnavailable", err)
	}
}

// TestMemoryMaxRecordsConcurrent: racing Begins of distinct keys never
// overshoot the capacity.
func TestMemoryMaxRecordsConcurrent(t *testing.T) {
	const max, callers = 50, 200
	s, err := idempotency.NewMemoryStoreWith(&idempotency.MemoryOptions{MaxRecords: max})
	if err != nil {
		t.Fatal(err)
	}
	var claimed, refused atomic.Int32
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, ok, err := s.Begin(context.Background(), fmt.Sprintf("k%d", i), "fp", memBase, time.Second, time.Minute)
			switch {
			case ok:
				claimed.Add(1)
			case errors.Is(err, idempotency.ErrUnavailable):
				refused.Add(1)
			default:
				t.Errorf("Begin(k%d) = %v, %v", i, ok, err)
			}
		}()
	}
	wg.Wait()
	if claimed.Load() != max || refused.Load() != callers-max || s.Len() != max {
		t.Fatalf("claimed %d, refused %d, Len %d; want %d, %d, %d", claimed.Load(), refused.Load(), s.Len(), max, callers-max, max)
	}
}

func TestNewMemoryStoreWith(t *testing.T) {
	if _, err := idempotency.NewMemoryStoreWith(&idempotency.MemoryOptions{MaxRecords: -1}); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("MaxRecords -1: err = %v, want ErrInvalidConfig", err)
	}
	for _, opts := range []*idempotency.MemoryOptions{nil, {}, {MaxRecords: 1}} {
		s, err := idempotency.NewMemoryStoreWith(opts)
		if err != nil || s == nil {
			t.Fatalf("NewMemoryStoreWith(%+v) = %v, %v", opts, s, err)
		}
		if _, ok, err := s.Begin(context.Background(), "k", "fp", memBase, time.Second, time.Minute); err != nil || !ok {
			t.Errorf("NewMemoryStoreWith(%+v): Begin = %v, %v", opts, ok, err)
		}
	}
}

// TestMemoryFault: the seed's hook fails exactly the operation it names,
// with ErrUnavailable wrapping the hook's error, and changes nothing.
func TestMemoryFault(t *testing.T) {
	ctx := context.Background()
	ops := map[string]func(s *idempotency.MemoryStore, token uint64) error{
		"begin": func(s *idempotency.MemoryStore, _ uint64) error {
			_, _, err := s.Begin(ctx, "k", "fp", memBase.Add(time.Hour), time.Second, time.Minute)
			return err
		},
		"complete": func(s *idempotency.MemoryStore, tok uint64) error {
			return s.Complete(ctx, "k", tok, idempotency.Response{Status: 1}, memBase, time.Minute)
		},
		"extend": func(s *idempotency.MemoryStore, tok uint64) error {
			return s.Extend(ctx, "k", tok, memBase, 30*time.Second)
		},
		"release": func(s *idempotency.MemoryStore, tok uint64) error { return s.Release(ctx, "k", tok) },
		"get": func(s *idempotency.MemoryStore, _ uint64) error {
			_, err := s.Get(ctx, "k", memBase)
			return err
		},
		"delete": func(s *idempotency.MemoryStore, _ uint64) error { return s.Delete(ctx, "k") },
	}
	for _, name := range slices.Sorted(maps.Keys(ops)) {
		t.Run(name, func(t *testing.T) {
			s := idempotency.NewMemoryStore()
			rec, _, err := s.Begin(ctx, "k", "fp", memBase, time.Second, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			injected := errors.New("injected")
			var seen []string
			s.Fault = func(op string) error {
				seen = append(seen, op)
				if op == name {
					return injected
				}
				return nil
			}
			err = ops[name](s, rec.Token)
			if !errors.Is(err, idempotency.ErrUnavailable) || !errors.Is(err, injected) {
				t.Fatalf("%s with a failing Fault hook = %v, want ErrUnavailable wrapping the hook's error", name, err)
			}
			if !slices.Equal(seen, []string{name}) {
				t.Errorf("Fault saw ops %q, want [%q]", seen, name)
			}
			s.Fault = nil
			got, err := s.Get(ctx, "k", memBase)
			if err != nil || got.State != idempotency.Processing || got.Token != rec.Token || !got.LeaseUntil.Equal(rec.LeaseUntil) {
				t.Errorf("after the failed %s: Get = %+v, %v; want the claim unchanged", name, got, err)
			}
		})
	}
}

// TestMemoryLenWithinMaxRecords: Begins refused by a full store never make
// it count more records than MaxRecords, not even for a moment, so Len
// never reads more (and a Begin that comes for a record given back is not
// refused because others, refused, were counted meanwhile).
func TestMemoryLenWithinMaxRecords(t *testing.T) {
	s, err := idempotency.NewMemoryStoreWith(&idempotency.MemoryOptions{MaxRecords: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, ok, err := s.Begin(ctx, "held", "fp", memBase, time.Hour, time.Hour); !ok || err != nil {
		t.Fatalf("Begin(held) = %v, %v", ok, err)
	}
	var wg sync.WaitGroup
	var stop atomic.Bool
	var over atomic.Int64
	for w := range 4 {
		wg.Go(func() {
			for i := 0; !stop.Load() && i < 5000; i++ {
				if _, ok, err := s.Begin(ctx, fmt.Sprint("new-", w, "-", i), "fp", memBase, time.Hour, time.Hour); ok || !errors.Is(err, idempotency.ErrUnavailable) {
					t.Errorf("Begin on a full store = %v, %v; want ErrUnavailable", ok, err)
					return
				}
			}
		})
	}
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for !stop.Load() {
			if n := s.Len(); n > 1 {
				over.Store(int64(n))
				stop.Store(true)
			}
		}
	}()
	wg.Wait()
	stop.Store(true)
	<-watched
	if over := over.Load(); over > 0 {
		t.Errorf("Len read %d while Begins were refused by a store holding 1 record, MaxRecords 1", over)
	}
}
