package pgstore

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
)

// TestMigrateKilledWhileAnotherWaits: two processes migrate a new schema
// at once; the first is killed (its backend terminated) after running the
// migration's SQL, before recording the version, while the second waits
// for its lock. The first fails with ErrUnavailable and leaves nothing
// behind; the second migrates the whole schema; running Migrate again
// afterwards changes nothing.
func TestMigrateKilledWhileAnotherWaits(t *testing.T) {
	direct := testPool(t, 4, nil)
	schema := freshSchema(t, direct) + "_sub" // made by Migrate
	execOnCleanup(t, direct, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	firstApp, secondApp := testenv.Unique("pgstore_mig_a_"), testenv.Unique("pgstore_mig_b_")
	var (
		armed   atomic.Bool
		killErr = make(chan error, 1)
	)
	tracer := &hookTracer{end: func(sql string) {
		if !strings.Contains(sql, "CREATE SEQUENCE") || !armed.CompareAndSwap(true, false) {
			return
		}
		// The first process has run the migration: wait until the second
		// waits for the lock, then kill the first's backend.
		killErr <- killAdvisoryHolder(ctx, direct, firstApp, secondApp)
	}}
	first := namedPool(t, direct, firstApp, tracer)
	second := namedPool(t, direct, secondApp, nil)
	a, err := New(first, &Options{Schema: schema, Table: "keys"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(second, &Options{Schema: schema, Table: "keys"})
	if err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	aErr := make(chan error, 1)
	go func() { aErr <- a.Migrate(ctx) }()
	// The second starts once the first holds its locks.
	waitHolding(ctx, t, direct, firstApp)
	if err := b.Migrate(ctx); err != nil {
		t.Fatalf("Migrate of the second process: %v", err)
	}
	select {
	case err := <-killErr:
		if err != nil {
			t.Fatalf("killing the first process's backend: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the first process never ran the migration's CREATE SEQUENCE")
	}
	if err := <-aErr; !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Migrate of the killed process = %v, want ErrUnavailable", err)
	}
	_, latest, err := b.SchemaVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantSchemaVersion(ctx, t, b, latest, "after both")
	var versions int
	if err := direct.QueryRow(ctx, b.names.Replace("SELECT count(*) FROM {{versions}}")).Scan(&versions); err != nil || versions != latest {
		t.Fatalf("%d version rows (%v), want %d", versions, err, latest)
	}
	if _, ok, err := b.Begin(ctx, "k", "fp", time.Now(), lease, retention); err != nil || !ok {
		t.Fatalf("Begin after the migrations = %v, %v", ok, err)
	}
	if err := a.Migrate(ctx); err != nil {
		t.Fatalf("Migrate again by the first process: %v", err)
	}
	wantSchemaVersion(ctx, t, a, latest, "after the first process migrated again")
}

// namedPool is a pool on direct's server whose connections carry the
// application_name app, closed when t ends.
func namedPool(t *testing.T, direct *pgxpool.Pool, app string, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg := direct.Config()
	cfg.MaxConns = 2
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// advisoryQuery finds a backend of app holding an advisory lock that a
// backend of waiter waits for, by their application names.
const advisoryQuery = `SELECT h.pid FROM pg_locks w
	JOIN pg_stat_activity wa ON wa.pid = w.pid AND wa.application_name = $2
	JOIN pg_locks h ON h.locktype = 'advisory' AND h.granted AND h.database = w.database
		AND h.classid = w.classid AND h.objid = w.objid AND h.objsubid = w.objsubid
	JOIN pg_stat_activity ha ON ha.pid = h.pid AND ha.application_name = $1
	WHERE w.locktype = 'advisory' AND NOT w.granted LIMIT 1`

// killAdvisoryHolder waits (at most 10s) until a backend of waiter waits
// for an advisory lock that a backend of holder holds, then terminates the
// holder.
func killAdvisoryHolder(ctx context.Context, direct *pgxpool.Pool, holder, waiter string) error {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var pid int32
		err := direct.QueryRow(ctx, advisoryQuery, holder, waiter).Scan(&pid)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return err
		}
		var ok bool
		if err := direct.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
			return errors.Join(errors.New("pg_terminate_backend failed"), err)
		}
		return nil
	}
	return errors.New("no backend waited for the holder's advisory lock within 10s")
}

// waitHolding waits (at most 10s) until a backend of app holds an
// advisory lock.
func waitHolding(ctx context.Context, t *testing.T, direct *pgxpool.Pool, app string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var held bool
		if err := direct.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks l JOIN pg_stat_activity a USING (pid)
			WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = $1)`, app).Scan(&held); err != nil {
			t.Fatal(err)
		}
		if held {
			return
		}
	}
	t.Fatalf("no backend of %s held an advisory lock within 10s", app)
}
