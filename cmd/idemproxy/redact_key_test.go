package main

import (
	"fmt"
	"net/http"
	"strconv"
	"testing"

	"github.com/archlab/idempotency/idemhttp"
)

// TestRedactKey: the client's key is hidden where a store's error names the
// stored key (quoted, after its scope), and nowhere else: a short key such
// as "a" or "1" must not eat into the rest of the message.
func TestRedactKey(t *testing.T) {
	const storeDown = "idempotency: begin: idempotency store unavailable: dial tcp 127.0.0.1:6379: connect: connection refused"
	for _, tc := range []struct {
		key, scope string
	}{
		{"a", ""}, {"1", ""}, {"a", "auth:1f2e"}, {`we"ird\key`, "t1"}, {"order-17", "auth:abc"},
	} {
		r, _ := http.NewRequest(http.MethodPost, "http://x/", nil)
		r.Header["Idempotency-Key"] = []string{strconv.Quote(tc.key)}
		if got := redactKey(storeDown, r); got != storeDown {
			t.Errorf("key %q: %q became %q; want it unchanged", tc.key, storeDown, got)
		}
		named := fmt.Sprintf("boltstore: key %q: boltstore: corrupt record: bad varint", idemhttp.StoreKey(tc.scope, tc.key))
		want := fmt.Sprintf("boltstore: key %q: boltstore: corrupt record: bad varint", idemhttp.StoreKey(tc.scope, "<key>"))
		if got := redactKey(named, r); got != want {
			t.Errorf("key %q, scope %q: %q became %q; want %q", tc.key, tc.scope, named, got, want)
		}
	}
}
