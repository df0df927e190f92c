package testenv

import (
	"context"
	"strings"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Toxiproxy starts an in-process toxiproxy named name in front of upstream
// (host:port), listening on a free loopback port (proxy.Listen), stopped
// when t ends. Toxics are added with AddToxic or through proxy.Toxics.
func Toxiproxy(t testing.TB, name, upstream string) *toxiproxy.Proxy {
	t.Helper()
	api := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	proxy := toxiproxy.NewProxy(api, name, "127.0.0.1:0", upstream)
	if err := proxy.Start(); err != nil {
		t.Fatalf("starting toxiproxy in front of %s: %v", upstream, err)
	}
	t.Cleanup(proxy.Stop)
	return proxy
}

// AddToxic adds a toxic, in toxiproxy's JSON form, to proxy.
func AddToxic(t testing.TB, proxy *toxiproxy.Proxy, toxicJSON string) {
	t.Helper()
	if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(toxicJSON)); err != nil {
		t.Fatalf("adding toxic %s: %v", toxicJSON, err)
	}
}

// RemoveToxic removes proxy's toxic named name, if it has one.
func RemoveToxic(proxy *toxiproxy.Proxy, name string) {
	_ = proxy.Toxics.RemoveToxic(context.Background(), name)
}
