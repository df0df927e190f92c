package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// TestReplayCacheMatchesStore runs one random sequential history through a
// ReplayCache in front of a MemoryStore and through a twin MemoryStore
// alone. Every change goes through the cache (claims, completions,
// releases, deletions), so nothing may be stale: each answer of the cache
// must be the twin's, field for field, while the clock moves, records
// expire, bodies and headers vary and the cache's budget makes it evict.
// Forget and ForgetAll come in between and must change no answer.
//
//	IDEMPOTENCY_SEED=n   replay seed n (default: time-based, printed)
func TestReplayCacheMatchesStore(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("IDEMPOTENCY_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (replay: IDEMPOTENCY_SEED=%d go test -run TestReplayCacheMatchesStore -count=1 .)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	ctx := context.Background()
	twin := idempotency.NewMemoryStore()
	c := newCache(t, idempotency.NewMemoryStore(), &idempotency.CacheOptions{
		TTL: time.Duration(1+rng.IntN(50)) * time.Millisecond, MaxBytes: 200 << 10})
	now := t0
	tokens := map[string]uint64{} // the last token claimed per key, current or not
	steps := 20000
	if testing.Short() {
		steps = 4000
	}
	for step := range steps {
		now = now.Add(time.Duration(rng.IntN(100)) * time.Microsecond)
		key := "k" + strconv.Itoa(rng.IntN(40))
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d step %d key %s: %s", seed, step, key, fmt.Sprintf(format, args...))
		}
		sameErr := func(what string, a, b error) {
			t.Helper()
			if (a == nil) != (b == nil) || !errors.Is(a, idempotency.ErrLeaseLost) && errors.Is(b, idempotency.ErrLeaseLost) ||
				!errors.Is(a, idempotency.ErrNotFound) && errors.Is(b, idempotency.ErrNotFound) {
				fail("%s: cache %v, store %v", what, a, b)
			}
		}
		complete := func(key string, tok uint64) {
			body := make([]byte, rng.IntN(3000))
			for i := range body {
				body[i] = byte(step + i)
			}
			resp := idempotency.Response{Status: 200 + step%100, Body: body}
			switch rng.IntN(3) {
			case 0:
				resp.Header = map[string][]string{"X-Step": {strconv.Itoa(step)}, "X-Nil": nil, "X-Empty": {}}
			case 1:
				resp.Header = map[string][]string{}
			}
			retention := time.Duration(1+rng.IntN(80)) * time.Millisecond
			sameErr("Complete", c.Complete(ctx, key, tok, resp, now, retention), twin.Complete(ctx, key, tok, resp, now, retention))
		}
		op := rng.IntN(20)
		if op >= 10 && op < 16 {
			// Complete, Extend and Release of a record past its window
			// may or may not find it, as the store has collected it or
			// not (the contract lets it): only live records, then.
			if _, err := twin.Get(ctx, key, now); err != nil {
				continue
			}
		}
		switch {
		case op < 10:
			fp := []string{"a", "b"}[rng.IntN(10)/9]
			lease := time.Duration(1+rng.IntN(5)) * time.Millisecond
			retention := lease + time.Duration(rng.IntN(80))*time.Millisecond
			got, gotOK, gotErr := c.Begin(ctx, key, fp, now, lease, retention)
			want, wantOK, wantErr := twin.Begin(ctx, key, fp, now, lease, retention)
			sameErr("Begin", gotErr, wantErr)
			if gotOK != wantOK || !reflect.DeepEqual(got, want) {
				fail("Begin(%s) = %v %+v, store %v %+v", fp, gotOK, got, wantOK, want)
			}
			if gotOK {
				tokens[key] = got.Token
				if rng.IntN(2) == 0 {
					complete(key, got.Token)
				}
			}
			if got.State == idempotency.Done && len(got.Response.Body) > 0 {
				got.Response.Body[0] ^= 0xff // the caller's to change
				for k := range got.Response.Header {
					got.Response.Header[k] = append(got.Response.Header[k], "added")
				}
			}
		case op < 14:
			tok := tokens[key]
			if rng.IntN(10) == 0 {
				tok-- // a stale or never-issued token
			}
			complete(key, tok)
		case op < 15:
			lease := time.Duration(1+rng.IntN(5)) * time.Millisecond
			sameErr("Extend", c.Extend(ctx, key, tokens[key], now, lease), twin.Extend(ctx, key, tokens[key], now, lease))
		case op < 16:
			sameErr("Release", c.Release(ctx, key, tokens[key]), twin.Release(ctx, key, tokens[key]))
		case op < 17:
			got, gotErr := c.Get(ctx, key, now)
			want, wantErr := twin.Get(ctx, key, now)
			sameErr("Get", gotErr, wantErr)
			if !reflect.DeepEqual(got, want) {
				fail("Get = %+v, store %+v", got, want)
			}
		case op < 18:
			sameErr("Delete", c.Delete(ctx, key), twin.Delete(ctx, key))
		case op < 19:
			c.Forget(key)
		default:
			if rng.IntN(20) == 0 {
				c.ForgetAll()
			}
		}
	}
	st := c.Stats()
	t.Logf("%+v", st)
	if st.Hits == 0 {
		t.Fatal("no Begin was answered from memory: the test exercised nothing")
	}
}
