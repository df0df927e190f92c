package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/archlab/idempotency"
)

func Example() {
	store := idempotency.NewMemoryStore()
	guard, err := idempotency.NewGuard(store, &idempotency.Options{Lease: 10 * time.Second, Retention: time.Hour})
	if err != nil {
		panic(err)
	}
	charges := 0
	charge := func(ctx context.Context) (idempotency.Response, error) {
		charges++
		return idempotency.Response{Status: 201, Body: []byte("charged 12.99")}, nil
	}
	for attempt := 1; attempt <= 3; attempt++ {
		resp, outcome, err := guard.Do(context.Background(), "order-42", "sku=A&qty=1", charge)
		fmt.Println(attempt, outcome, resp.Status, string(resp.Body), err)
	}
	_, outcome, err := guard.Do(context.Background(), "order-42", "sku=A&qty=9", charge)
	fmt.Println(outcome, errors.Is(err, idempotency.ErrConflict))
	fmt.Println("charges:", charges)
	// Output:
	// 1 EXECUTED 201 charged 12.99 <nil>
	// 2 REPLAYED 201 charged 12.99 <nil>
	// 3 REPLAYED 201 charged 12.99 <nil>
	// CONFLICT true
	// charges: 1
}

// A downstream write fenced by the claim's token: a holder whose lease was
// taken over (its process stalled past the lease) cannot overwrite the work
// of the holder that replaced it, because its token is smaller.
func ExampleTokenFrom() {
	type row struct {
		state string
		fence uint64
	}
	orders := map[string]row{}
	// In SQL: UPDATE orders SET state=$1, fence=$2 WHERE id=$3 AND fence < $2
	fencedWrite := func(id, state string, token uint64) bool {
		if orders[id].fence >= token {
			return false
		}
		orders[id] = row{state, token}
		return true
	}
	guard := &idempotency.Guard{Store: idempotency.NewMemoryStore()}
	_, _, _ = guard.Do(context.Background(), "order-7", "fp", func(ctx context.Context) (idempotency.Response, error) {
		token, _ := idempotency.TokenFrom(ctx)
		fmt.Println("write accepted:", fencedWrite("order-7", "paid", token))
		// A stale holder with an older token arrives late:
		fmt.Println("stale write accepted:", fencedWrite("order-7", "failed", token-1))
		return idempotency.Response{Status: 200}, nil
	})
	fmt.Println(orders["order-7"].state)
	// Output:
	// write accepted: true
	// stale write accepted: false
	// paid
}

// Marking an error Retryable releases the key at once: the retry runs now
// instead of waiting for the lease to end.
func ExampleRetryable() {
	guard := &idempotency.Guard{Store: idempotency.NewMemoryStore(), Lease: time.Minute}
	calls := 0
	fn := func(ctx context.Context) (idempotency.Response, error) {
		calls++
		if calls == 1 {
			return idempotency.Response{}, idempotency.Retryable(errors.New("card network refused the connection"))
		}
		return idempotency.Response{Status: 201}, nil
	}
	_, outcome, err := guard.Do(context.Background(), "k", "fp", fn)
	fmt.Println(outcome, err)
	_, outcome, err = guard.Do(context.Background(), "k", "fp", fn)
	fmt.Println(outcome, err, calls)
	// Output:
	// EXECUTED card network refused the connection
	// EXECUTED <nil> 2
}

// A replay cache in front of a shared store: the first replay reads the
// store, the ones after it, within the TTL, are answered from memory.
func ExampleNewReplayCache() {
	shared := idempotency.NewMemoryStore() // in production: redisstore, pgstore
	cache, err := idempotency.NewReplayCache(shared, &idempotency.CacheOptions{TTL: time.Second})
	if err != nil {
		panic(err)
	}
	guard := &idempotency.Guard{Store: cache}
	send := func(ctx context.Context) (idempotency.Response, error) {
		return idempotency.Response{Status: 202, Body: []byte("queued")}, nil
	}
	for range 4 {
		resp, outcome, _ := guard.Do(context.Background(), "mail-9", "fp", send)
		fmt.Println(outcome, string(resp.Body))
	}
	st := cache.Stats()
	fmt.Println("from memory:", st.Hits, "from the store:", st.Misses)
	// Output:
	// EXECUTED queued
	// REPLAYED queued
	// REPLAYED queued
	// REPLAYED queued
	// from memory: 2 from the store: 2
}
