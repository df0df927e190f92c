package storeurl

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/testenv"
)

// TestSkipVerifyWithCAFile: skip_verify=true (or 1) contradicts
// tls_ca_file= and is refused; skip_verify=false (or 0) says what
// tls_ca_file= implies and is accepted with it, on every TLS form.
func TestSkipVerifyWithCAFile(t *testing.T) {
	ca := url.QueryEscape(writeCAFile(t, testenv.NewCA(t, "storeurl test CA")))
	for _, form := range []string{"rediss://127.0.0.1:1/0", "rediss+cluster://127.0.0.1:1,127.0.0.1:2", "rediss+sentinel://127.0.0.1:1/m"} {
		for _, tc := range []struct {
			skip    string
			refused bool
		}{{"true", true}, {"1", true}, {"false", false}, {"0", false}} {
			raw := form + "?skip_verify=" + tc.skip + "&tls_ca_file=" + ca
			err := Check(raw)
			if tc.refused && (!errors.Is(err, idempotency.ErrInvalidConfig) || !strings.Contains(err.Error(), "contradict")) {
				t.Errorf("Check(%q) = %v; want ErrInvalidConfig saying they contradict", raw, err)
			}
			if !tc.refused && err != nil {
				t.Errorf("Check(%q) = %v; want nil", raw, err)
			}
		}
	}
}
