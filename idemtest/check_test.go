package idemtest_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/idemtest"
)

// goexitStore ends the goroutine of whoever calls Begin, as a test double
// that calls t.FailNow does.
type goexitStore struct{ idempotency.Store }

func (goexitStore) Begin(context.Context, string, string, time.Time, time.Duration, time.Duration) (idempotency.Record, bool, error) {
	runtime.Goexit()
	panic("unreachable")
}

// TestCheckClauseCutShort: a clause that stops before its end, without a
// failure recorded, is not a clause that held. Check used to return nil for
// it, having checked nothing.
func TestCheckClauseCutShort(t *testing.T) {
	c := idemtest.Clauses()[0]
	err := c.Check(context.Background(), goexitStore{idempotency.NewMemoryStore()})
	if err == nil || !strings.Contains(err.Error(), c.Name) {
		t.Fatalf("Check of %s on a store that ends its caller's goroutine = %v; want an error naming the clause", c.Name, err)
	}
	t.Log(err)
}
