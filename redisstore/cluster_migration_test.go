package redisstore

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/archlab/idempotency"
)

// TestBatchClusterSlotMigration: while a slot moves from one master to the
// other (MIGRATING/IMPORTING, MIGRATE, SETSLOT NODE), concurrent Begins on
// its keys go out in batches that meet ASK and MOVED replies. Each must
// still claim its own new key (a script run twice would answer "in flight"
// for its own claim) and the claim must be found afterwards. The cluster is
// two private servers, so the shared one is never touched.
func TestBatchClusterSlotMigration(t *testing.T) {
	src := startPrivateServer(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	dst := startPrivateServer(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	ctx := context.Background()
	cs, cd := src.client(t), dst.client(t)
	const tag = "{t}" // slot 15891, so src holds the upper half
	for _, step := range []struct {
		c    *redis.Client
		args []any
	}{
		{cs, []any{"cluster", "addslotsrange", 8192, 16383}},
		{cd, []any{"cluster", "addslotsrange", 0, 8191}},
		{cs, []any{"cluster", "meet", "127.0.0.1", dst.port}},
	} {
		if err := step.c.Do(ctx, step.args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; ; i++ {
		a, _ := cs.ClusterInfo(ctx).Result()
		b, _ := cd.ClusterInfo(ctx).Result()
		if strings.Contains(a, "cluster_state:ok") && strings.Contains(b, "cluster_state:ok") &&
			strings.Contains(a, "cluster_known_nodes:2") && strings.Contains(b, "cluster_known_nodes:2") {
			break
		}
		if i == 200 {
			t.Fatalf("private cluster not ready:\n%s\n%s", a, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	slot, err := cs.ClusterKeySlot(ctx, tag).Result()
	if err != nil || slot < 8192 {
		t.Fatalf("slot of %s = %d, %v; want one of the source's", tag, slot, err)
	}
	srcID, err1 := cs.Do(ctx, "cluster", "myid").Text()
	dstID, err2 := cd.Do(ctx, "cluster", "myid").Text()
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{src.addr(), dst.addr()}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	s := newStore(t, c, Options{Logger: discard()})
	if _, _, err := s.Begin(ctx, tag+"warm", "fp", time.Now(), time.Minute, time.Hour); err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	var mu sync.Mutex
	var claimed []string
	var wg sync.WaitGroup
	for w := range 32 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := tag + strconv.Itoa(w) + "-" + strconv.Itoa(i)
				_, ok, err := s.Begin(ctx, key, "fp", time.Now(), time.Minute, time.Hour)
				if err != nil || !ok {
					t.Errorf("Begin(%s) during the slot's migration = %v, %v; want a claim", key, ok, err)
					continue
				}
				mu.Lock()
				claimed = append(claimed, key)
				mu.Unlock()
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	migrate := func() error {
		if err := cd.Do(ctx, "cluster", "setslot", slot, "importing", srcID).Err(); err != nil {
			return err
		}
		if err := cs.Do(ctx, "cluster", "setslot", slot, "migrating", dstID).Err(); err != nil {
			return err
		}
		for {
			keys, err := cs.Do(ctx, "cluster", "getkeysinslot", slot, 100).StringSlice()
			if err != nil || len(keys) == 0 {
				break
			}
			args := []any{"migrate", "127.0.0.1", dst.port, "", 0, 5000, "keys"}
			for _, k := range keys {
				args = append(args, k)
			}
			if err := cs.Do(ctx, args...).Err(); err != nil {
				return err
			}
		}
		if err := cs.Do(ctx, "cluster", "setslot", slot, "node", dstID).Err(); err != nil {
			return err
		}
		return cd.Do(ctx, "cluster", "setslot", slot, "node", dstID).Err()
	}
	err = migrate()
	time.Sleep(300 * time.Millisecond)
	close(stop)
	hangGuard(t, 20*time.Second, "Begins during a slot migration", wg.Wait)
	if err != nil {
		t.Fatalf("migrating slot %d: %v", slot, err)
	}
	if s.batches.Load() == 0 {
		t.Fatal("no batch was sent: the test proved nothing about batches")
	}
	info, err := cs.Info(ctx, "errorstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(info, "errorstat_MOVED") && !strings.Contains(info, "errorstat_ASK") {
		t.Fatalf("the source answered no MOVED or ASK: the test proved nothing about redirects\n%s", info)
	}
	if n, err := cs.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("source still holds %d keys (%v) after the migration", n, err)
	}
	for _, key := range claimed {
		if rec, err := s.Get(ctx, key, time.Now()); err != nil || rec.State != idempotency.Processing {
			t.Fatalf("Get(%s) after the migration = %+v, %v; want its claim", key, rec, err)
		}
	}
	t.Logf("%d claims, %d pipelines carried %d operations; %s", len(claimed), s.batches.Load(), s.batchedOps.Load(), info)
}
