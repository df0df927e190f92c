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
	// last '@' (a password may hold a raw '@'), or later where the
	// password was cut short (cutPassword), as often as that finds the
	// user info cut short again. bolt:///PATH names a file, whose path
	// may hold an @ and a :.
	at := -1
	bolt := strings.ToLower(strings.TrimSpace(scheme))
	for {
		end := len(rest)
		if i := strings.IndexAny(rest[at+1:], "/?#"); i >= 0 {
			end = at + 1 + i
		}
		if i := strings.LastIndex(rest[at+1:end], "@"); i >= 0 {
			at += 1 + i
		}
		if end == 0 && (bolt == "bolt" || bolt == "boltdb") {
			break
		}
		i := cutPassword(rest[at+1:end], rest[end:])
		if i < 0 {
			break
		}
		at = end + i
	}
	if _, pass, _ := strings.Cut(rest[:max(at, 0)], ":"); at >= 0 && pass == "" {
		// No password, or an empty one: a raw @ in the user name or in
		// the password may have ended the user info too early, and a
		// later @ with a : before it may end it.
		if j := strings.LastIndex(rest, "@"); strings.Contains(rest[:j], ":") {
			at = j
		}
	}
	var userinfo string
	inValue := false
	if at >= 0 {
		userinfo, rest = rest[:at], rest[at+1:]
		// An @ in the query may end the user info inside a secret's
		// value: the rest of that value follows it.
		_, inValue = redactParams(userinfo, false)
		user, _, hasPass := strings.Cut(userinfo, ":")
		userinfo, _ = redactParams(user, false)
		if hasPass {
			userinfo += ":xxxxx"
		}
		userinfo += "@"
	}
	// All that follows the user info is read as parameters: one that an
	// @ in the query ended leaves the rest of the query as the host.
	rest, _ = redactParams(rest, inValue)
	return scheme + "://" + userinfo + rest
}

// redactParams hides the values of the secret parameters in q, the rest
// of a secret's value first if inValue, and reports whether q ends in a
// secret's value. When in doubt it hides more: any of & # ? starts a
// parameter (a # or ? may have been meant as part of a value, or a query
// in the fragment), and a secret's value runs to the next &.
func redactParams(q string, inValue bool) (string, bool) {
	var b strings.Builder
	if inValue {
		end := strings.IndexByte(q, '&')
		if q == "" {
			return "", true
		}
		if end < 0 {
			return "xxxxx", true
		}
		b.WriteString("xxxxx")
		q = q[end:]
	}
	for q != "" {
		end := strings.IndexAny(q, "&#?")
		if end < 0 {
			end = len(q)
		}
		k, _, _ := strings.Cut(q[:end], "=")
		if name, err := url.QueryUnescape(k); err != nil || name != "password" && name != "sslpassword" && name != paramSentinelPassword {
			if end < len(q) {
				end++
			}
			b.WriteString(q[:end])
			q = q[end:]
			continue
		}
		b.WriteString(k + "=xxxxx")
		if end = strings.IndexByte(q, '&'); end < 0 {
			return b.String(), true
		}
		b.WriteByte('&')
		q = q[end+1:]
	}
	return b.String(), false
}

// cutPassword returns where in tail the user info of a URL ends whose
// password an unencoded / ? or # cut short (-1: it was not cut); hosts is
// what of the authority follows its last '@', if any. As parseURL judges
// it: an '@' in the path, the fragment or a query parameter's name is the
// rest of a password, and the last of them ends it (after an '@' in a
// name, so does one in a value). Failing that, hosts that url.Parse would
// not take, or with a port that is not a number, or none at all, are a
// user and the start of a password, which runs to the last '@' of all (an
// '@' in a query value is then part of it too).
func cutPassword(hosts, tail string) int {
	if !strings.Contains(tail, "@") {
		return -1
	}
	const (
		inPath = iota
		inName
		inValue
		inFragment
	)
	// cut: a parameter's name held an @, so the query is part of a
	// password, and so is an @ in a value after it.
	state, last, cut := inPath, -1, false
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
		case c == '@' && (state != inValue || cut):
			last, cut = i, cut || state == inName
		}
	}
	if last >= 0 {
		return last
	}
	if hosts == "" {
		return strings.LastIndex(tail, "@")
	}
	for _, host := range strings.Split(hosts, ",") {
		if _, err := url.Parse("redis://" + host); err != nil {
			return strings.LastIndex(tail, "@")
		}
		if strings.HasPrefix(host, "[") {
			_, host, _ = strings.Cut(host, "]")
		}
		if _, port, ok := strings.Cut(host, ":"); ok && strings.Trim(port, "0123456789") != "" {
			return strings.LastIndex(tail, "@")
		}
	}
	return -1
}
