package idemhttp

import (
	"testing"

	"go.uber.org/goleak"
)

// No goroutine may outlive the tests: a handler the middleware left
// running, a renewer whose claim ended, a waiter of Options.Wait. Idle
// keep-alive connections of the test clients are not the middleware's and
// are closed by the servers' Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
