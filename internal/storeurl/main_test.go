package storeurl

import (
	"testing"

	"go.uber.org/goleak"
)

// Every store a test opens is closed, and a failed Open closes what it
// made: no client, pool or committer may outlive it.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
