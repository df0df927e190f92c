package storeurl

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/archlab/idempotency"
)

// lockedBuffer is a bytes.Buffer for a logger written from several
// goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRedisUnreachableAtOpen: as Open's doc says, a redis URL whose server
// does not answer opens; the warning that the server's maxmemory-policy
// could not be read goes to Options.Logger, and each call of the store
// fails with ErrUnavailable.
func TestRedisUnreachableAtOpen(t *testing.T) {
	for _, raw := range []string{
		"redis://127.0.0.1:1/0?max_retries=-1&dial_timeout=200ms",
		"redis+cluster://127.0.0.1:1,127.0.0.1:2?max_retries=-1&dial_timeout=200ms",
		"redis+sentinel://127.0.0.1:1/m?max_retries=-1&dial_timeout=200ms",
	} {
		t.Run(strings.Split(raw, ":")[0], func(t *testing.T) {
			var logged lockedBuffer
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			s, c, err := Open(ctx, raw, Options{Logger: slog.New(slog.NewTextHandler(&logged, nil))})
			if err != nil {
				t.Fatalf("Open(%q) = %v; want the store", raw, err)
			}
			defer c.Close()
			if !strings.Contains(logged.String(), "maxmemory-policy") {
				t.Errorf("Open(%q) logged %q to Options.Logger; want the warning that maxmemory-policy could not be read", raw, logged.String())
			}
			if _, err := s.Get(ctx, "k", time.Now()); !errors.Is(err, idempotency.ErrUnavailable) {
				t.Errorf("Get on %q = %v; want ErrUnavailable", raw, err)
			}
		})
	}
}

// TestBoltMissingDirUnavailable: a bolt file whose directory does not exist
// cannot be opened: ErrUnavailable, as Open's doc says, naming the path.
func TestBoltMissingDirUnavailable(t *testing.T) {
	path := t.TempDir() + "/missing/idem.db"
	s, c, err := Open(context.Background(), "bolt:"+path, Options{})
	if c != nil {
		c.Close()
	}
	if !errors.Is(err, idempotency.ErrUnavailable) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open(bolt:%s) = %T, %v; want ErrUnavailable naming the path", path, s, err)
	}
}
