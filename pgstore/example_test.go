package pgstore_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/pgstore"
)

// A Guard on PostgreSQL: migrate once at startup, then guard each request.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgstore.New(pool, &pgstore.Options{Schema: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	guard, err := idempotency.NewGuard(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	resp, outcome, err := guard.Do(ctx, "key-from-client", "sha256-of-body", func(ctx context.Context) (idempotency.Response, error) {
		return idempotency.Response{Status: 201, Body: []byte(`{"id":"ch_1"}`)}, nil
	})
	log.Println(resp.Status, outcome, err)
}

// CompleteTx commits the business write and the stored result together,
// without the Guard: claim with Begin, write and complete in one
// transaction. A crash or rollback leaves the key claimed until its lease
// ends, and then the next Begin takes it over.
func ExampleStore_CompleteTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgstore.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	const lease, retention = 30 * time.Second, 24 * time.Hour
	rec, claimed, err := store.Begin(ctx, "key-from-client", "sha256-of-body", time.Now(), lease, retention)
	if err != nil || !claimed {
		log.Println("replay, in flight, conflict or unavailable:", rec.State, err)
		return
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// Fence the business write with the token as well.
		if _, err := tx.Exec(ctx, "INSERT INTO charges (key, amount, fence) VALUES ($1, $2, $3)",
			"key-from-client", 1000, int64(rec.Token)); err != nil {
			return err
		}
		resp := idempotency.Response{Status: 201, Body: []byte(`{"id":"ch_1"}`)}
		return store.CompleteTx(ctx, tx, "key-from-client", rec.Token, resp, time.Now(), retention)
	})
	if errors.Is(err, idempotency.ErrLeaseLost) {
		log.Println("another holder took the key over; nothing was committed")
	}
}
