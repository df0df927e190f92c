package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestJSONLogsStayJSONWhileRedisIsDown: with -log-format json, the Redis
// client's own complaints (dials that fail) come out as JSON lines of the
// proxy's logger, not as plain text beside them.
func TestJSONLogsStayJSONWhileRedisIsDown(t *testing.T) {
	up := newUpstream(t)
	p := startProc(t, binary(t), "-upstream", up.URL, "-store", "redis://"+freeAddr(t)+"/0", "-log-format", "json")
	if r, _ := post(t, http.DefaultClient, p.proxy, "/orders", "k", "x"); r.status != http.StatusServiceUnavailable {
		t.Fatalf("POST with Redis down = %d, want 503", r.status)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(p.logs.String(), "redis client") {
		if time.Now().After(deadline) {
			t.Fatalf("no Redis client message logged within 5s:\n%s", p.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, line := range strings.Split(strings.TrimSpace(p.logs.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("a line on stderr is not JSON: %q", line)
		}
	}
}
