package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// TestConnectionResetsKeepEveryAnswerTrue runs Guards over a toxiproxy
// that resets connections (TCP RST) now and then, seeded: as the request
// goes up (nothing applied) or as the answer comes down (applied, answer
// lost), at random points of Begin and Complete. The clock stands still,
// so no lease ends and a key may run at most once. Afterwards, with the
// path healed, it checks what each call was told against what the
// database holds: no key ran twice, every replay is the result of the
// key's one run, every success was stored, and a failure of Complete left
// the claim or the result.
func TestConnectionResetsKeepEveryAnswerTrue(t *testing.T) {
	direct := testPool(t, 4, nil)
	schema := freshSchema(t, direct)
	s := migratedStore(t, direct, schema, Options{Table: "resets"})
	proxy, proxied := proxiedPool(t, direct, 8)
	t.Cleanup(proxy.Stop)
	ps, err := New(proxied, &Options{Schema: schema, Table: "resets", OpTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	g := faultGuard(t, ps, newClock())
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d (the schedule of resets also depends on timing)", seed)

	type call struct {
		out  idempotency.Outcome
		err  error
		body string
		ran  string // the run of this call's fn, if it ran
	}
	var (
		mu    sync.Mutex
		runs  = map[string][]string{} // key: bodies of its runs
		calls = map[string][]call{}
	)
	ctx, stop := context.WithCancel(context.Background())
	var chaos sync.WaitGroup
	chaos.Go(func() {
		r := rand.New(rand.NewPCG(seed, 0))
		for ctx.Err() == nil {
			time.Sleep(time.Duration(5+r.IntN(30)) * time.Millisecond)
			stream := []string{"upstream", "downstream"}[r.IntN(2)]
			toxic := fmt.Sprintf(`{"name":"reset","type":"reset_peer","stream":%q,"attributes":{"timeout":%d}}`, stream, r.IntN(3))
			if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
				t.Errorf("adding toxic: %v", err)
				return
			}
			time.Sleep(time.Duration(1+r.IntN(5)) * time.Millisecond)
			if err := proxy.Toxics.RemoveToxic(context.Background(), "reset"); err != nil {
				t.Errorf("removing toxic: %v", err)
				return
			}
		}
	})
	const workers, perWorker, keys = 12, 40, 30
	var wg sync.WaitGroup
	for w := range workers {
		r := rand.New(rand.NewPCG(seed, uint64(w+1)))
		wg.Go(func() {
			for i := range perWorker {
				key := fmt.Sprintf("k%d", r.IntN(keys))
				var c call
				body := fmt.Sprintf("%s by %d.%d", key, w, i)
				resp, out, err := g.Do(context.Background(), key, "fp", func(context.Context) (idempotency.Response, error) {
					mu.Lock()
					runs[key] = append(runs[key], body)
					mu.Unlock()
					c.ran = body
					return idempotency.Response{Status: 200, Body: []byte(body)}, nil
				})
				c.out, c.err, c.body = out, err, string(resp.Body)
				mu.Lock()
				calls[key] = append(calls[key], c)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	stop()
	chaos.Wait()
	_ = proxy.Toxics.RemoveToxic(context.Background(), "reset")

	failed := 0
	for key, cs := range calls {
		ran := runs[key]
		if len(ran) > 1 {
			t.Errorf("%s: fn ran %d times (%q), with no lease ended", key, len(ran), ran)
			continue
		}
		rec, err := s.Get(context.Background(), key, time.Now())
		if err != nil && !errors.Is(err, idempotency.ErrNotFound) {
			t.Fatalf("Get %s: %v", key, err)
		}
		if len(ran) == 1 && err != nil {
			t.Errorf("%s: fn ran (%q) but the key has no record", key, ran[0])
		}
		if err == nil && rec.State == idempotency.Done && (len(ran) == 0 || string(rec.Response.Body) != ran[0]) {
			t.Errorf("%s: stored result %q is not its run's (%q)", key, rec.Response.Body, ran)
		}
		for _, c := range cs {
			switch {
			case c.out == idempotency.Replayed:
				if c.err != nil || len(ran) == 0 || c.body != ran[0] {
					t.Errorf("%s: replayed %q (%v), but its run gave %q", key, c.body, c.err, ran)
				}
			case c.out == idempotency.Executed && c.err == nil:
				if rec.State != idempotency.Done || string(rec.Response.Body) != c.ran {
					t.Errorf("%s: Do succeeded with %q, but the store holds %+v (%v)", key, c.ran, rec, err)
				}
			case c.out == idempotency.Executed:
				failed++
				if !errors.Is(c.err, idempotency.ErrUnavailable) {
					t.Errorf("%s: Complete failed with %v, want ErrUnavailable", key, c.err)
				}
				if err != nil || rec.State == idempotency.Done && string(rec.Response.Body) != c.ran {
					t.Errorf("%s: after a failed Complete of %q the store holds %+v (%v); want the claim or that result", key, c.ran, rec, err)
				}
			case c.out == idempotency.Unavailable:
				failed++
				if c.ran != "" || !errors.Is(c.err, idempotency.ErrUnavailable) {
					t.Errorf("%s: Unavailable with fn run %q, err %v", key, c.ran, c.err)
				}
			case c.out == idempotency.InFlight:
				if !errors.Is(c.err, idempotency.ErrInFlight) {
					t.Errorf("%s: InFlight with %v", key, c.err)
				}
			default:
				t.Errorf("%s: outcome %v, %v", key, c.out, c.err)
			}
		}
	}
	t.Logf("%d keys, %d calls failed with ErrUnavailable", len(calls), failed)
}
