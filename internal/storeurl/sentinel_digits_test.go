package storeurl

import (
	"errors"
	"testing"

	"github.com/archlab/idempotency"
)

// TestSentinelDigitMaster: a sentinel URL's path of one all-digit segment
// is refused as a database without a master; an all-digit master name
// followed by its database is a master name.
func TestSentinelDigitMaster(t *testing.T) {
	if err := Check("redis+sentinel://s1:1/007"); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("Check(/007) = %v; want ErrInvalidConfig", err)
	}
	fo, _, err := sentinelOptions("redis+sentinel", "//s1:1/007/2")
	if err != nil {
		t.Fatalf("sentinelOptions(/007/2): %v", err)
	}
	if fo.MasterName != "007" || fo.DB != 2 {
		t.Errorf("/007/2: master %q, db %d; want 007 and 2", fo.MasterName, fo.DB)
	}
}
