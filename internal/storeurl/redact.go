package storeurl

import (
	"net/url"
	"strings"
)

// Redact hides the secrets of a store (or any) URL for logs and errors,
// also of one net/url cannot parse (a cluster URL with several or IPv6
// hosts, a password with an unencoded / ? or # that ends the authority
// early): the password of its user info and the values of its password,
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
	at := strings.LastIndex(rest[:end], "@")
	if at < 0 && end > 0 {
		if i := cutPassword(rest[:end], rest[end:]); i >= 0 {
			at = end + i
		}
	}
	var userinfo string
	if at >= 0 {
		userinfo, rest = rest[:at+1], rest[at+1:]
		if user, _, hasPass := strings.Cut(userinfo, ":"); hasPass {
			userinfo = user + ":xxxxx@"
		}
		if end = strings.IndexAny(rest, "/?#"); end < 0 {
			end = len(rest)
		}
	}
	authority, tail := userinfo+rest[:end], rest[end:]
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

// cutPassword returns where in tail the user info of a URL ends whose
// password an unencoded / ? or # cut short, leaving authority without an
// '@' (-1: it was not cut). As parseURL judges it: an '@' in the path, the
// fragment or a query parameter's name is the rest of a password, and the
// last of them ends it; failing that, an authority whose port is not a
// number is a user and the start of a password, which runs to the last
// '@' of all (an '@' in a query value is then part of it too).
func cutPassword(authority, tail string) int {
	if !strings.Contains(tail, "@") {
		return -1
	}
	const (
		inPath = iota
		inName
		inValue
		inFragment
	)
	state, last := inPath, -1
	for i := 0; i < len(tail); i++ {
		switch c := tail[i]; {
		case c == '#' && state != inFragment:
			state = inFragment
		case c == '?' && state == inPath:
			state = inName
		case c == '=' && state == inName:
			state = inValue
		case c == '&' && (state == inName || state == inValue):
			state = inName
		case c == '@' && state != inValue:
			last = i
		}
	}
	if last >= 0 {
		return last
	}
	for _, host := range strings.Split(authority, ",") {
		if strings.HasPrefix(host, "[") {
			_, host, _ = strings.Cut(host, "]")
		}
		if _, port, ok := strings.Cut(host, ":"); ok && strings.Trim(port, "0123456789") != "" {
			return strings.LastIndex(tail, "@")
		}
	}
	return -1
}
