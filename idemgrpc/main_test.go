package idemgrpc_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every server, connection and renewal started by a test is gone when it
// ends.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
