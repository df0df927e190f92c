package storeurl

import (
	"net/url"
	"strings"
)

// Redact hides the secrets of a store (or any) URL for logs and errors,
// also of one net/url cannot parse (a cluster URL with several or IPv6
// hosts): the password of its user info and the values of its password,
// sslpassword (pgx takes both from the query) and sentinel_password query
// parameters.
func Redact(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return s
	}
	// The authority ends where url.Parse ends it; its user info, at the
	// last '@' (a password may hold a raw '@').
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	authority, tail := rest[:end], rest[end:]
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		if user, _, hasPass := strings.Cut(authority[:at], ":"); hasPass {
			authority = user + ":xxxxx" + authority[at:]
		}
	}
	path, query, hasQuery := strings.Cut(tail, "?")
	if !hasQuery {
		return scheme + "://" + authority + tail
	}
	query, fragment, hasFragment := strings.Cut(query, "#")
	params := strings.Split(query, "&")
	for i, p := range params {
		k, _, _ := strings.Cut(p, "=")
		if name, err := url.QueryUnescape(k); err == nil && (name == "password" || name == "sslpassword" || name == paramSentinelPassword) {
			params[i] = k + "=xxxxx"
		}
	}
	out := scheme + "://" + authority + path + "?" + strings.Join(params, "&")
	if hasFragment {
		out += "#" + fragment
	}
	return out
}
