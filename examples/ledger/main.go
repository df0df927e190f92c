// Command ledger is the seed's ledger behind a Guard: a charge that a client
// retries (sequentially, concurrently, and after losing the first answer)
// runs once, and every retry gets the first answer back.
//
//	go run ./examples/ledger
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/archlab/idempotency"
)

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ledger:", err)
		os.Exit(1)
	}
}

// book is the seed's ledger: stock, reservations and charges.
type book struct {
	mu           sync.Mutex
	stock        int
	reservations map[string]int
	charges      map[string]int
	calls        int
}

// charge is the side effect. It is deliberately not idempotent on its own:
// every call that gets here takes stock and money.
func (b *book) charge(order string, qty, cents int) (idempotency.Response, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls++
	if b.stock < qty {
		return idempotency.Response{Status: 409, Body: []byte(`{"error":"OUT_OF_STOCK"}`)}, nil
	}
	b.stock -= qty
	b.reservations[order] += qty
	b.charges[order] += cents
	body := fmt.Sprintf(`{"order":%q,"charged":%d,"charge_id":"ch_%d"}`, order, cents, b.calls)
	return idempotency.Response{Status: 201, Body: []byte(body)}, nil
}

func run(ctx context.Context, out io.Writer) error {
	b := &book{stock: 10, reservations: map[string]int{}, charges: map[string]int{}}
	guard, err := idempotency.NewGuard(idempotency.NewMemoryStore(), &idempotency.Options{
		Lease: 5 * time.Second, Retention: time.Hour,
	})
	if err != nil {
		return err
	}
	pay := func(key, fingerprint string) (idempotency.Response, idempotency.Outcome, error) {
		return guard.Do(ctx, key, fingerprint, func(ctx context.Context) (idempotency.Response, error) {
			time.Sleep(50 * time.Millisecond) // a slow payment provider
			return b.charge(key, 1, 1299)
		})
	}

	fmt.Fprintln(out, "1. first attempt; pretend its answer is lost on the way back")
	resp, outcome, err := pay("order-42", "sku=A&qty=1")
	report(out, resp, outcome, err)

	fmt.Fprintln(out, "2. the client retries the same key and payload")
	resp, outcome, err = pay("order-42", "sku=A&qty=1")
	report(out, resp, outcome, err)

	fmt.Fprintln(out, "3. eight concurrent duplicates of a new order")
	var wg sync.WaitGroup
	outcomes := make([]idempotency.Outcome, 8)
	for i := range outcomes {
		wg.Go(func() { _, outcomes[i], _ = pay("order-43", "sku=A&qty=1") })
	}
	wg.Wait()
	fmt.Fprintf(out, "   outcomes: %v\n", outcomes)

	fmt.Fprintln(out, "4. the same key with another payload")
	resp, outcome, err = pay("order-42", "sku=A&qty=5")
	report(out, resp, outcome, err)

	b.mu.Lock()
	defer b.mu.Unlock()
	fmt.Fprintf(out, "\nhandler calls=%d stock=%d charges=%v\n", b.calls, b.stock, b.charges)
	if b.calls != 2 || b.charges["order-42"] != 1299 || b.charges["order-43"] != 1299 {
		return errors.New("a charge ran more than once")
	}
	fmt.Fprintln(out, "each order was charged exactly once")
	return nil
}

func report(out io.Writer, resp idempotency.Response, outcome idempotency.Outcome, err error) {
	if err != nil {
		fmt.Fprintf(out, "   %s: %v\n", outcome, err)
		return
	}
	fmt.Fprintf(out, "   %s: %d %s\n", outcome, resp.Status, resp.Body)
}
