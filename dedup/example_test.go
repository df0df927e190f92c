package dedup_test

import (
	"context"
	"fmt"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
)

func Example() {
	// One store shared by every consumer of the queue; MemoryStore here.
	w, err := dedup.New(idempotency.NewMemoryStore(), &dedup.Options{Prefix: "orders/"})
	if err != nil {
		panic(err)
	}
	charge := func(id string) func(context.Context) error {
		return func(context.Context) error {
			fmt.Println("charging", id)
			return nil
		}
	}
	// The broker delivers order-1 twice (a redelivery after a lost ack).
	for _, id := range []string{"order-1", "order-2", "order-1"} {
		d, err := w.Process(context.Background(), id, charge(id))
		fmt.Println(id, d.Action, d.Outcome, err)
	}
	// Output:
	// charging order-1
	// order-1 ACK EXECUTED <nil>
	// charging order-2
	// order-2 ACK EXECUTED <nil>
	// order-1 ACK REPLAYED <nil>
}
