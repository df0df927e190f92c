// Package idemhttp is net/http middleware implementing the IETF
// Idempotency-Key header draft (draft-ietf-httpapi-idempotency-key-header)
// on top of an idempotency.Guard.
//
//	guard, _ := idempotency.NewGuard(store, nil)
//	mw, err := idemhttp.New(guard, &idemhttp.Options{Required: true})
//	if err != nil { ... }
//	http.Handle("POST /payments", mw.Handler(payments))
//
// # What is guarded
//
// POST and PATCH requests (Options.Methods) that carry an Idempotency-Key.
// Without a key a request passes through, unless Options.Required, which
// answers 400. The key is an RFC 8941 sf-string ("abc") or a bare token
// (abc); both name one key (see ParseKey).
//
// The key is stored as scope + "\x00" + key (StoreKey), where the scope is
// Options.Scope(r) (by default a hash of the Authorization header, or of the
// TLS client certificate's identity, its issuer included, without one, see
// DefaultScope): one caller's response is never replayed to another.
//
// The fingerprint is the hex SHA-256 of the method, the escaped path
// (URL.EscapedPath: as sent, so /a%2Fb is neither /a/b nor /a%252Fb), the
// query with its pairs decoded and sorted by name (values of one name keep
// their order; a pair that URL.Query drops, with a semicolon or a bad
// escape, is kept as sent), the Options.FingerprintHeaders (Content-Type)
// and the body.
// The body is read (up to Options.MaxBody, or an outer
// http.MaxBytesReader's limit, else 413) before the handler runs and handed
// to it again, from memory, with its length in Request.ContentLength (a
// chunked upload's too, unless it has trailers). The same key for another request, another path included, is
// a conflict (422, or 409), never a replay. The host is in neither: one
// middleware in front of several hosts (virtual hosting) should add
// r.Host to its Scope, or a caller's key used on two hosts for the same
// path and body replays the first host's response on the second. Likewise
// the path is the one the middleware sees: mounted under http.StripPrefix
// on two prefixes, it sees one path for both.
//
// Both forms are part of the stored records, so a change of them shows
// across an upgrade, for retries whose first attempt reached the older
// build. The fingerprint's canonical form is versioned (v3: the escaped
// path and the semicolon pairs): a record stored by a build with another
// version is a conflict for the same request, never a replay nor a second
// run. The scope of a request with a TLS client certificate and no
// Authorization header was "" before DefaultScope read the certificate,
// and left the certificate's issuer out before the issuer was made part of
// it: either way such a retry is in a new scope, and runs again.
//
// # Outcomes
//
//   - Executed: the handler's response goes to the client as it is written
//     and is captured for the store. Statuses are stored per
//     Options.StoreStatus: 2xx, 3xx and 4xx but 408, 425 and 429. Others
//     (5xx) release the key so a retry runs at once; see below for the
//     cases that keep it.
//   - Replayed: the stored status, header fields and body, with
//     Idempotent-Replayed: true. net/http sets Date, Content-Length and the
//     sniffed Content-Type again; Set-Cookie is not stored (DefaultStoreHeader,
//     which, like StoreHeader, judges a field by its canonical name), nor
//     are Connection and the fields it names (hop-by-hop, whatever the
//     policy; the first response sends them as the handler set them).
//     Fields an outer handler set before the middleware ran (a request id,
//     CORS) are not stored unless the handler changed them: a replay keeps
//     the retry's own.
//   - In flight: 409 with Retry-After, the seconds left on the holder's
//     lease (at least 1). With Options.Wait the request first waits up to
//     that long for the holder to finish, then replays its response (or
//     runs, if the holder released the key); still in flight by then, it
//     gets the 409.
//   - Store unavailable: 503 with Retry-After; the handler does not run.
//   - Lease lost while the handler ran: the response is sent as written but
//     not stored, and the Observer sees LeaseLost.
//
// Problems are RFC 9457 application/problem+json, with the stable type URIs
// and titles of the Problem variables (ProblemBase + name).
//
// The window is advertised in Idempotency-Expires (Options.WindowHeader),
// an IMF-fixdate: on a replay the record's expiry, on an executed response
// whose status is stored the time the status is sent plus the Guard's
// Retention (the stored record lives a little longer, from when it was
// stored). It is not a standard header.
//
// # Capture
//
// Every way a handler writes is captured: Write (before or after
// WriteHeader), io.Copy through ReadFrom, Flush, repeated WriteHeader (the
// first final status counts), 1xx informational responses (sent, not
// stored) and trailers (declared with the Trailer header or set with
// http.TrailerPrefix); those the client got (HTTP/1 sends them only in a
// chunked body) are replayed as trailers. A Content-Type that net/http
// sniffed from a first chunk cut short by Flush is stored as sent.
// http.ResponseController reaches the underlying writer through Unwrap.
// Hijack is passed through; a hijacked connection cannot be replayed, so its
// key is released when the handler returns and a retry runs again. The
// writer is the handler's only until it returns: a goroutine that uses it
// later gets errors from its writes and false from KeepClaim, and never
// reaches another request.
//
// A response body larger than Options.MaxStoredResponse is delivered in
// full, and a marker is stored instead: a retry gets 409
// response-not-replayable, stating the original status, rather than running
// the operation a second time.
//
// # Clients that go away
//
// A client that disconnects before its claim is granted never reaches the
// handler (unless Options.Detach): the Guard does not start it with a done
// context, and releases the claim (Observer: Unavailable, with the
// context's error). Once the
// handler runs, its request context is cancelled when the client
// disconnects (and also when the Guard loses the lease). A duplicate that arrives
// meanwhile gets 409, never a second execution. When the handler still
// answers with a stored status, the response is stored and replayed to the
// retry, unless a write to the client failed: the handler may have stopped
// there, so a marker is stored instead of a body that may be cut short, and
// the retry gets 409 response-not-replayable as for a response too large to
// store. When it answers with a status that is not stored (a 5xx after
// cancellation, typically), the key is not released, because the side
// effect may have happened in part: the claim is kept until its lease ends,
// after which a retry runs again (Observer: Abandoned). Options.Detach gives
// the handler a context that ignores the client's cancellation, so that
// the operation finishes and its response is stored; under Detach a write
// that fails because the client is gone is hidden from the handler too (the
// response is captured all the same), since handlers such as
// httputil.ReverseProxy abort at the first failed write.
//
// # Keeping the claim
//
// Some failures leave the outcome unknown: the work may have been done but
// its response is lost. Releasing the key then would let a retry run the
// operation a second time at once; storing the error would replay it for the
// whole window. The middleware keeps the claim instead, stores nothing, and
// lets the lease end (a retry meanwhile gets 409 in-flight; after it, the
// retry runs). Four ways lead there, besides the client going away:
//
//   - The Guard's Timeout ends the handler's context (with
//     context.DeadlineExceeded, whether or not Detach is set) and the
//     handler answers with a status that is not stored: it gave up partway,
//     as when the client goes away. A stored status is stored as usual.
//   - The handler calls KeepClaim(w) before it returns, for example after an
//     upstream timeout once the request was sent. Whatever it writes goes to
//     the client, whatever the status, and is not stored.
//   - The handler panics with http.ErrAbortHandler, the way
//     httputil.ReverseProxy aborts a response whose upstream broke off in
//     the middle of the body (or whose client went away while it was
//     copied). The panic is passed on after the claim is settled, so the
//     server still aborts the response.
//   - The handler panics with anything else after it sent a status that is
//     stored (it announced the work done, and the client, whose response is
//     cut short, retries) or called KeepClaim. The panic is passed on after
//     the claim is settled, as an error whose message holds the value and
//     the stack where it was raised (Unwrap gives the value if it is an
//     error). A handler that calls runtime.Goexit in the same situation
//     (t.FailNow in a test handler, or a library that stops its goroutine
//     so) keeps the claim too; Goexit goes on, since nothing can stop it,
//     and the Guard, told before it sees the handler's goroutine end, lets
//     the claim be (Event.Err says Goexit).
//
// The Observer sees Abandoned in each case. Any other panic (before a
// status was sent, or after one that is not stored) releases the key and
// goes on as it was raised (the middleware tries the Release a second time
// if the Guard's failed; if that fails too, the claim stays until its lease
// ends, and the Observer sees Abandoned, its Err wrapping
// idempotency.ErrNotReleased); so does any other Goexit.
//
// # Operator tools
//
// StoreKey(scope, key) is the key the middleware stores for a request, to
// look a record up, evict it or release it in the store.
//
// # Observing
//
// Options.Observer sees every guarded request's Outcome, status, latency
// and error, after the response was sent.
package idemhttp
