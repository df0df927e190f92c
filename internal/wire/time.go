package wire

import (
	"math"
	"time"
)

// After is n+d for a time n in Unix nanoseconds, saturated: a Duration that
// runs past the end of int64 nanoseconds (the year 2262) must not wrap to
// an instant in the past, which would make a record expired as soon as
// written.
func After(n int64, d time.Duration) int64 {
	switch {
	case d > 0 && n > math.MaxInt64-int64(d):
		return math.MaxInt64
	case d < 0 && n < math.MinInt64-int64(d):
		return math.MinInt64
	}
	return n + int64(d)
}
