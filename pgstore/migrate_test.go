package pgstore

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestMigrateIsIdempotent(t *testing.T) {
	pool := testPool(t, 4, nil)
	schema := freshSchema(t, pool)
	s, err := New(pool, &Options{Schema: schema + "_sub", Table: "keys"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+"_sub CASCADE")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cur, latest, err := s.SchemaVersion(ctx)
	if err != nil || cur != 0 || latest < 1 {
		t.Fatalf("SchemaVersion before Migrate = %d, %d, %v; want 0 and at least 1", cur, latest, err)
	}
	for i := range 2 {
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("Migrate #%d: %v", i+1, err)
		}
	}
	cur, latest, err = s.SchemaVersion(ctx)
	if err != nil || cur != latest {
		t.Fatalf("SchemaVersion after Migrate = %d, %d, %v", cur, latest, err)
	}
	var rows int
	if err := pool.QueryRow(ctx, s.names.Replace("SELECT count(*) FROM {{versions}}")).Scan(&rows); err != nil || rows != latest {
		t.Fatalf("%d version rows (%v), want one per migration (%d)", rows, err, latest)
	}
	if _, _, err := s.Begin(ctx, "k", "fp", time.Now(), lease, retention); err != nil {
		t.Fatalf("Begin on the migrated schema (created by Migrate): %v", err)
	}
}

func TestMigrateConcurrently(t *testing.T) {
	pool := testPool(t, 8, nil)
	schema := freshSchema(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for round := range 3 {
		table := []string{"a", "b", "c"}[round]
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Go(func() {
				s, err := New(pool, &Options{Schema: schema, Table: table})
				if err == nil {
					err = s.Migrate(ctx)
				}
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: concurrent Migrate: %v", round, err)
			}
		}
		s, _ := New(pool, &Options{Schema: schema, Table: table})
		cur, latest, err := s.SchemaVersion(ctx)
		if err != nil || cur != latest {
			t.Fatalf("round %d: SchemaVersion = %d, %d, %v", round, cur, latest, err)
		}
		if _, ok, err := s.Begin(ctx, "k", "fp", time.Now(), lease, retention); err != nil || !ok {
			t.Fatalf("round %d: Begin = %v, %v", round, ok, err)
		}
	}
}
