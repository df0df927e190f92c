package storeurl

import (
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The sentinels' own credentials, when they ask for any: query parameters
// of the sentinel forms, which Open takes itself. The URL's user info is
// the master's (and its replicas') user, as in the other redis forms.
const (
	// defaultSentinelPort is the port of a sentinel address given without one.
	defaultSentinelPort = "26379"

	paramSentinelUser     = "sentinel_username"
	paramSentinelPassword = "sentinel_password"
)

// ownSentinelParams are the query parameters of the sentinel forms that
// Open takes for itself.
var ownSentinelParams = append([]string{paramSentinelUser, paramSentinelPassword}, ownRedisParams...)

// refusedSentinelParams are go-redis failover URL options a sentinel store
// URL refuses, and why.
var refusedSentinelParams = map[string]string{
	"master_name":                "the master name is the URL's path: /mastername[/db]",
	"addr":                       "list the sentinels in the URL's host, separated by commas",
	"db":                         "the database is the URL's path: /mastername/db",
	"username":                   "give the master's user in the URL's user info (user:pass@), the sentinels' in sentinel_username=",
	"password":                   "give the master's password in the URL's user info (user:pass@), the sentinels' in sentinel_password=",
	"replica_only":               "the store writes: it needs the master",
	"use_disconnected_replicas":  "the store writes: it needs the master",
	"route_by_latency":           "the store writes: it needs the master",
	"route_by_latency_tolerance": "the store writes: it needs the master",
	"route_randomly":             "the store writes: it needs the master",
}

// sentinelOptions parses
// redis+sentinel://[user:pass@]h1:p1,h2:p2/mastername[/db][?opts] (rest is
// what follows the scheme's colon): the failover client's options and our
// own parameters. The hosts are the sentinels'; the master is found
// through them by name, and the user info authenticates to it.
func sentinelOptions(scheme, rest string) (*redis.FailoverOptions, map[string]string, error) {
	form := scheme + "://host:port,host:port/mastername[/db]"
	if !strings.HasPrefix(rest, "//") {
		return nil, nil, invalid("%s URL must look like %s", scheme, form)
	}
	rest = rest[2:]
	hostsAndPath, query, _ := strings.Cut(rest, "?")
	var userinfo string
	if i := strings.LastIndex(hostsAndPath, "@"); i >= 0 {
		// Split first: an unencoded / in the password is the password's
		// problem (parseURL says so), not a path.
		userinfo, hostsAndPath = hostsAndPath[:i+1], hostsAndPath[i+1:]
	}
	hosts, path, _ := strings.Cut(hostsAndPath, "/")
	var addrs []string
	for _, a := range strings.Split(hosts, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return nil, nil, invalid("%s URL names no sentinel: want %s", scheme, form)
	}
	base := strings.TrimSuffix(strings.ToLower(scheme), "+sentinel")
	u, err := parseURL(base + "://" + userinfo + addrs[0] + "/" + path + "?" + query)
	if err != nil {
		return nil, nil, err
	}
	// Checked after parseURL, which refuses without quoting them the URLs
	// whose password ends the authority early.
	for i, a := range addrs {
		if !strings.Contains(a, ":") || strings.HasPrefix(a, "[") && strings.HasSuffix(a, "]") {
			a = net.JoinHostPort(strings.Trim(a, "[]"), defaultSentinelPort)
		}
		if h, p, err := net.SplitHostPort(a); err != nil || h == "" || p == "" {
			return nil, nil, invalid("%s URL: sentinel address %q is not host[:port] (an IPv6 address in brackets)", scheme, addrs[i])
		}
		addrs[i] = a
	}
	master, db, err := sentinelPath(scheme, form, u)
	if err != nil {
		return nil, nil, err
	}
	p, err := takeParams(u, ownSentinelParams...)
	if err != nil {
		return nil, nil, err
	}
	if _, err := redisClock(p["clock"]); err != nil {
		return nil, nil, err
	}
	if _, ok := p[paramSentinelUser]; ok {
		if _, ok := p[paramSentinelPassword]; !ok {
			return nil, nil, invalid("%s= needs %s= (a sentinel user authenticates with a password)", paramSentinelUser, paramSentinelPassword)
		}
	}
	q := u.Query()
	for name := range q {
		if why, ok := refusedSentinelParams[name]; ok {
			return nil, nil, invalid("%s URL: query parameter %q is not accepted: %s", scheme, name, why)
		}
	}
	q.Set("master_name", master)
	for _, a := range addrs[1:] {
		q.Add("addr", a)
	}
	// go-redis's failover URL: the first sentinel as the host, the others
	// as addr=, no user info (go-redis would take it for the sentinels').
	gu := url.URL{Scheme: base, Host: addrs[0], Path: "/" + strconv.Itoa(db), RawQuery: q.Encode()}
	fo, err := redis.ParseFailoverURL(gu.String())
	if err != nil {
		return nil, nil, invalid("%v", err)
	}
	if u.User != nil {
		fo.Username = u.User.Username()
		fo.Password, _ = u.User.Password()
	}
	fo.SentinelUsername, fo.SentinelPassword = p[paramSentinelUser], p[paramSentinelPassword]
	if err := applyTLSParams(fo.TLSConfig, strings.ToLower(scheme), p); err != nil {
		return nil, nil, err
	}
	fo.ContextTimeoutEnabled = true
	if fo.DialTimeout == 0 {
		// go-redis's default, which NewFailoverClient fills in its own
		// copies only; the TLS dialer below needs it too.
		fo.DialTimeout = 5 * time.Second
	}
	// The master and replicas are found through the sentinels, by the
	// address they announce (usually an IP): each one's certificate may
	// name that host or the URL's first host, as for a cluster's nodes.
	if d := nodeDialer(fo.TLSConfig, func() time.Duration { return fo.DialTimeout }); d != nil {
		fo.Dialer = d
	}
	return fo, p, nil
}

// sentinelPath returns the master name and database of a sentinel URL's
// path, /mastername[/db], each segment percent-decoded.
func sentinelPath(scheme, form string, u *url.URL) (string, int, error) {
	segs := strings.Split(strings.TrimPrefix(u.EscapedPath(), "/"), "/")
	if len(segs) > 1 && segs[len(segs)-1] == "" {
		segs = segs[:len(segs)-1] // a trailing slash
	}
	if len(segs) > 2 {
		return "", 0, invalid("%s URL path has %d segments: want %s", scheme, len(segs), form)
	}
	master, err := url.PathUnescape(segs[0])
	if err != nil || master == "" {
		return "", 0, invalid("%s URL names no master: want %s (the name the sentinels monitor it by, as in sentinel monitor NAME ...)", scheme, form)
	}
	if _, err := strconv.ParseUint(master, 10, 64); err == nil && len(segs) == 1 {
		return "", 0, invalid("%s URL names no master: /%s is a database number; want %s", scheme, master, form)
	}
	db := 0
	if len(segs) == 2 {
		n, err := strconv.ParseUint(segs[1], 10, 31)
		if err != nil {
			return "", 0, invalid("%s URL: database %q is not a number: want %s", scheme, segs[1], form)
		}
		db = int(n)
	}
	return master, db, nil
}
