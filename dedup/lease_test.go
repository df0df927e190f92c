package dedup_test

import (
	"testing"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/dedup"
)

// TestLeaseReportsTheClaimsLease: adapters check Lease against the broker's
// redelivery timeout, so it must be the lease the claims really get.
func TestLeaseReportsTheClaimsLease(t *testing.T) {
	for _, tc := range []struct {
		opts *dedup.Options
		want time.Duration
	}{
		{nil, idempotency.DefaultLease},
		{&dedup.Options{Lease: 7 * time.Second}, 7 * time.Second},
	} {
		w := newWindow(t, idempotency.NewMemoryStore(), tc.opts)
		if got := w.Lease(); got != tc.want {
			t.Errorf("Lease() with %+v = %v, want %v", tc.opts, got, tc.want)
		}
	}
}
