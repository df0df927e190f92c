package idemhttp

import (
	"errors"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
)

// A declared Content-Length is a claim, not bytes received: a client that
// declares MaxBody and sends a few bytes (then stalls) must not make the
// middleware hold MaxBody of memory for it, or a few thousand such
// connections exhaust the server's memory before any body arrives.
func TestDeclaredLengthNotAllocatedUpFront(t *testing.T) {
	const declared = 1 << 20
	stalled := errors.New("client stalled")
	r, _ := http.NewRequest(http.MethodPost, "/", io.MultiReader(strings.NewReader("0123456789"), errReader{stalled}))
	r.ContentLength = declared
	st := &state{}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := st.readBody(r, declared)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, stalled) {
		t.Fatalf("readBody = %v, want the body's error", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > declared/4 {
		t.Fatalf("reading 10 bytes of a body declared as %d allocated %d bytes", declared, got)
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }
