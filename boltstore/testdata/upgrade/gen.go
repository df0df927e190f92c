// Command gen wrote the records-<commit> files of boltstore, redisstore
// and pgstore testdata/upgrade: build it inside a checkout of that commit
// (copied to a directory of its own there) and run it with the output
// directory and IDEMPOTENCY_TEST_REDIS_URL and IDEMPOTENCY_TEST_POSTGRES_URL
// set; records.db, redis.json and pg.json are the three files.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	idem "github.com/archlab/idempotency"
	"github.com/archlab/idempotency/boltstore"
	"github.com/archlab/idempotency/pgstore"
	"github.com/archlab/idempotency/redisstore"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

var doneResp = idem.Response{
	Status: 201,
	Header: map[string][]string{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}, "X-Empty": {""}, "X-Bin": {"\x00\xff"}},
	Body:   []byte("{\"id\":42}\x00\xff"),
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

func write(ctx context.Context, s idem.Store) {
	b := func(k, fp string, lease time.Duration) uint64 {
		r, ok, err := s.Begin(ctx, k, fp, t0, lease, 24*time.Hour)
		must(err)
		if !ok {
			panic("not claimed: " + k)
		}
		return r.Token
	}
	t := b("done", "fp-done", 30*time.Second)
	must(s.Complete(ctx, "done", t, doneResp, t0.Add(time.Second), 24*time.Hour))
	t = b("zero", "fp-zero", 30*time.Second)
	must(s.Complete(ctx, "zero", t, idem.Response{}, t0.Add(time.Second), 24*time.Hour))
	b("inflight", "fp-inflight", 2*time.Hour)
	b("abandoned", "fp-abandoned", time.Minute)
	t = b("released", "fp-released", 30*time.Second)
	must(s.Release(ctx, "released", t))
	t = b("deleted", "fp-deleted", 30*time.Second)
	must(s.Complete(ctx, "deleted", t, doneResp, t0.Add(time.Second), 24*time.Hour))
	must(s.Delete(ctx, "deleted"))
	t = b("short", "fp-short", 30*time.Second)
	must(s.Complete(ctx, "short", t, doneResp, t0.Add(time.Second), 5*time.Minute))
}

func main() {
	ctx := context.Background()
	out := os.Args[1]
	must(os.MkdirAll(out, 0o755))
	// bolt
	bs, err := boltstore.Open(out+"/records.db", nil)
	must(err)
	write(ctx, bs)
	must(bs.Close())
	// redis, caller's clock: dump every hash field
	o, err := redis.ParseURL(os.Getenv("IDEMPOTENCY_TEST_REDIS_URL"))
	must(err)
	o.ContextTimeoutEnabled = true
	rc := redis.NewClient(o)
	prefix := fmt.Sprintf("compatgen-%d:", os.Getpid())
	rs, err := redisstore.New(rc, &redisstore.Options{Prefix: prefix, Clock: redisstore.CallerClock})
	must(err)
	write(ctx, rs)
	dump := map[string]map[string][]byte{}
	keys, err := rc.Keys(ctx, prefix+"*").Result()
	must(err)
	for _, k := range keys {
		m, err := rc.HGetAll(ctx, k).Result()
		must(err)
		f := map[string][]byte{}
		for n, v := range m {
			f[n] = []byte(v)
		}
		dump[k[len(prefix):]] = f
		rc.Del(ctx, k)
	}
	js, err := json.MarshalIndent(dump, "", "\t")
	must(err)
	must(os.WriteFile(out+"/redis.json", append(js, '\n'), 0o644))
	rc.Close()
	// pg, caller's clock: dump every row and the sequence
	pool, err := pgxpool.New(ctx, os.Getenv("IDEMPOTENCY_TEST_POSTGRES_URL"))
	must(err)
	schema := fmt.Sprintf("compatgen_%d", os.Getpid())
	ps, err := pgstore.New(pool, &pgstore.Options{Schema: schema, Clock: pgstore.CallerClock})
	must(err)
	must(ps.Migrate(ctx))
	write(ctx, ps)
	type row struct {
		Key, Fingerprint []byte
		State            string
		Token            int64
		LeaseUntil       *int64
		ExpiresAt        int64
		Status           *int64
		Headers, Body    []byte
	}
	var rows []row
	rs2, err := pool.Query(ctx, "SELECT key, fingerprint, state, token, lease_until, expires_at, status, headers, body FROM "+schema+".idempotency_keys ORDER BY token")
	must(err)
	for rs2.Next() {
		var r row
		must(rs2.Scan(&r.Key, &r.Fingerprint, &r.State, &r.Token, &r.LeaseUntil, &r.ExpiresAt, &r.Status, &r.Headers, &r.Body))
		rows = append(rows, r)
	}
	must(rs2.Err())
	var last int64
	must(pool.QueryRow(ctx, "SELECT last_value FROM "+schema+".idempotency_keys_token_seq").Scan(&last))
	js, err = json.MarshalIndent(map[string]any{"rows": rows, "seq": last}, "", "\t")
	must(err)
	must(os.WriteFile(out+"/pg.json", append(js, '\n'), 0o644))
	_, err = pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
	must(err)
	pool.Close()
	fmt.Println("written to", out)
}
