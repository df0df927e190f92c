package pgstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/archlab/idempotency"
)

// TestMigrateTablesSharingAMissingSchema: processes that each migrate
// their own table into a schema that does not exist yet all succeed.
func TestMigrateTablesSharingAMissingSchema(t *testing.T) {
	pool := testPool(t, 16, nil)
	b := make([]byte, 6)
	rand.Read(b)
	schema := "idem_edge_" + hex.EncodeToString(b)
	execOnCleanup(t, pool, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tables := []string{"t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8"}
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, len(tables))
	for _, table := range tables {
		wg.Go(func() {
			s, err := New(pool, &Options{Schema: schema, Table: table})
			if err == nil {
				<-start
				err = s.Migrate(ctx)
			}
			errs <- err
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Migrate of one table while others migrate into the same new schema: %v", err)
		}
	}
	for _, table := range tables {
		s, _ := New(pool, &Options{Schema: schema, Table: table})
		if cur, latest, err := s.SchemaVersion(ctx); err != nil || cur != latest {
			t.Fatalf("SchemaVersion of %s = %d, %d, %v", table, cur, latest, err)
		}
	}
}

// TestOddKeys: keys and fingerprints are bytes (NUL, invalid UTF-8, long).
func TestOddKeys(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	ctx := context.Background()
	now := time.Now()
	long := make([]byte, 8000)
	rand.Read(long)
	for name, key := range map[string]string{
		"nul":               "a\x00b",
		"only nul":          "\x00",
		"invalid":           "\xff\xfe\xc3",
		"empty":             "",
		"long compressible": string(bytes.Repeat([]byte("k"), 100000)),
	} {
		t.Run(name, func(t *testing.T) {
			fp := "fp\x00" + key
			rec, ok, err := s.Begin(ctx, key, fp, now, lease, retention)
			if err != nil || !ok {
				t.Fatalf("Begin = %v, %v", ok, err)
			}
			if other, ok, err := s.Begin(ctx, key+"\x00"+name, fp, now, lease, retention); err != nil || !ok || other.Token == rec.Token {
				t.Fatalf("Begin of key+NUL = %+v, %v, %v; want a claim of its own", other, ok, err)
			}
			if err := s.Complete(ctx, key, rec.Token, idempotency.Response{Status: 200, Header: map[string][]string{"\xff\x00": {"\x00\xfe"}}}, now, retention); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			got, ok, err := s.Begin(ctx, key, fp, now, lease, retention)
			if err != nil || ok || got.State != idempotency.Done || got.Fingerprint != fp || got.Response.Header["\xff\x00"][0] != "\x00\xfe" {
				t.Fatalf("replay = %+v, %v, %v", got, ok, err)
			}
			if got, _, err := s.Begin(ctx, key, fp+"x", now, lease, retention); err != nil || got.State != idempotency.Conflict {
				t.Fatalf("other fp = %+v, %v", got, err)
			}
		})
	}
	// A key too long for the primary key's index (it does not compress)
	// fails closed with ErrUnavailable, as the package doc says.
	if _, _, err := s.Begin(ctx, string(long), "fp", now, lease, retention); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Begin of a %d-byte random key = %v, want ErrUnavailable", len(long), err)
	}
}

// TestMigrateUpToDateWithoutCreatePrivilege: an application role that may
// use the migrated schema but not create in it (the schema was migrated at
// deploy time) runs Migrate at startup: it has nothing to do, so it
// succeeds.
func TestMigrateUpToDateWithoutCreatePrivilege(t *testing.T) {
	pool := testPool(t, 4, nil)
	schema := freshSchema(t, pool)
	owner := migratedStore(t, pool, schema, Options{Table: "keys"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	b := make([]byte, 6)
	rand.Read(b)
	role := "idem_edge_" + hex.EncodeToString(b)
	for _, q := range []string{
		"CREATE ROLE " + role + " LOGIN",
		"GRANT USAGE ON SCHEMA " + schema + " TO " + role,
		owner.names.Replace("GRANT SELECT, INSERT, UPDATE, DELETE ON {{table}} TO " + role),
		owner.names.Replace("GRANT USAGE ON SEQUENCE {{seq}} TO " + role),
		owner.names.Replace("GRANT SELECT ON {{versions}} TO " + role),
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	execOnCleanup(t, pool, "DROP OWNED BY "+role+"; DROP ROLE "+role)

	cfg, err := pgxpool.ParseConfig(pool.Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	cfg.MaxConns = 2
	appPool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer appPool.Close()
	s, err := New(appPool, &Options{Schema: schema, Table: "keys"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate of an up-to-date schema by a role without CREATE: %v", err)
	}
	if cur, latest, err := s.SchemaVersion(ctx); err != nil || cur != latest {
		t.Fatalf("SchemaVersion = %d, %d, %v", cur, latest, err)
	}
	if _, ok, err := s.Begin(ctx, "k", "fp", time.Now(), lease, retention); err != nil || !ok {
		t.Fatalf("Begin as the application role = %v, %v", ok, err)
	}
}

// A retention meant as "for ever" is bounded (maxSpan) instead of
// overflowing the statements' nanosecond arithmetic: the key is claimed
// once, replayed after, and its window ends a century on.
func TestHugeRetention(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	ctx := context.Background()
	now := time.Now()
	forever := time.Duration(math.MaxInt64)
	rec, ok, err := s.Begin(ctx, "k", "fp", now, forever, forever)
	if err != nil || !ok {
		t.Fatalf("Begin with an endless lease and retention: %v, %v", ok, err)
	}
	if err := s.Complete(ctx, "k", rec.Token, idempotency.Response{Status: 201}, now, forever); err != nil {
		t.Fatal(err)
	}
	got, again, err := s.Begin(ctx, "k", "fp", now.Add(24*time.Hour), time.Minute, forever)
	if err != nil || again || got.State != idempotency.Done {
		t.Fatalf("Begin a day later = %+v, %v, %v; want the result replayed", got, again, err)
	}
	if got.ExpiresAt.Before(now.Add(99 * 365 * 24 * time.Hour)) {
		t.Errorf("window ends %v, want about a century on", got.ExpiresAt)
	}
}
