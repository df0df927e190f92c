// Package idemgrpc makes unary gRPC methods idempotent with an
// idempotency.Guard: a server interceptor that runs a handler at most once
// per idempotency key and replays its stored response to every retry, and a
// client interceptor that attaches a key to every call and keeps it across
// the caller's retries.
//
// # The key
//
// The server takes the key from the request message through
// Options.KeyFunc, in the style of AIP-155's request_id field, or, when that
// gives none, from the incoming metadata field "idempotency-key". The
// request's key comes first because the client interceptor gives every call
// a fresh metadata key: a retry with the same request_id must not be a new
// operation. Keys are 1 to 255 visible ASCII
// characters, in one metadata value: an empty value, two values (even
// equal ones), or a malformed key fails with InvalidArgument, even when
// keys are optional, since running the call unguarded would drop the
// idempotency its client asked for. The binary field "idempotency-key-bin"
// is another field, and is not read. A call without a key runs unguarded
// unless Options.Required is set, in which case it fails with
// InvalidArgument. With Options.Methods nil
// that is every unary method, health checks (grpc.health.v1.Health/Check)
// included: name the guarded methods when keys are required.
//
// Only unary methods are guarded: there is no stream interceptor, and a
// streaming call runs as it is, with or without a key.
//
// Keys are namespaced by Options.Scope, by default the caller's
// "authorization" metadata or, without one, the identity in its TLS client
// certificate, its issuer included (DefaultScope), so that one caller's
// stored response is never replayed to another. Put authentication before this
// interceptor in the chain: a replay, an in-flight or a conflict answer
// does not reach what comes after it. (Builds before the default scope,
// from before 2026-12-03 01:20 UTC, kept every caller's keys bare unless
// Scope was set; builds before DefaultScope read the certificate kept
// certificate callers' keys bare, and builds before it read the
// certificate's issuer scoped them without it. A retry whose first attempt
// reached any of them runs again on a newer build, in either direction
// during a rolling deploy.)
//
// The fingerprint is the SHA-256 of the full method name and the
// deterministic protobuf encoding of the request
// (proto.MarshalOptions{Deterministic: true}). Deterministic encoding is
// stable within one binary for the fields this server knows; two binaries
// built with different protobuf versions may encode maps differently, so a
// retry that reaches a server running another build may see a conflict for
// the same request. Bytes the server does not decode are hashed as the
// client sent them: unknown fields (from a client built with a newer
// schema) and the value of an Any. Go's default marshaling orders map
// entries at random, so such a client's retry, even of the same request
// message, may get FailedPrecondition. Keep the window short across
// upgrades, or use KeyFunc with requests whose encoding is canonical (no
// maps).
//
// Metadata is not part of the fingerprint, on purpose: a retry carries
// fields that change between attempts (trace ids, a renewed token, the
// deadline) and is still the same request. Metadata that does name the
// operation goes in Options.Scope, which can read it from the incoming
// context: its value then picks the key's namespace, so a call with another
// value is another operation and runs, rather than being refused with
// FailedPrecondition. Keep DefaultScope's part when doing so. To have such a
// field refused as a conflict, it has to be in the request message.
//
// # What is stored and replayed
//
// The response message (its wire encoding and its full type name), the
// header metadata the handler set with grpc.SetHeader or grpc.SendHeader and
// the trailer metadata it set with grpc.SetTrailer (captured by wrapping the
// handler's ServerTransportStream, so that grpc.SetSendCompressor and
// grpc.ClientSupportedCompressors, which need gRPC's own stream, fail in a
// guarded handler), and, when Options.StoreErrors is set, the status of a
// failed call. A replay sends the stored header metadata plus
// "idempotency-replayed: true", the stored trailer metadata, and a response
// decoded into a new message of the stored type (looked up in
// protoregistry.GlobalTypes, or made by Options.NewResponse), or the stored
// status, code, message and details, as the first call's client got them
// (a handler's error that is not a status is stored as gRPC sent it:
// Unknown with the error's text, or the code and details of the status it
// wraps with the error's whole text as message). Header and
// trailer fields keep all their values, in order, binary (-bin) ones
// included. One difference is the marker's doing: a first answer that
// failed without header metadata went out as trailers only (its client's
// header empty, its trailer holding content-type), while its replay sends a
// header, for the marker. Metadata set by interceptors before this one is
// not stored: they run again on a replay.
//
// # Status codes
//
//   - Another call holds the key (in flight): Aborted, with an
//     errdetails.RetryInfo whose delay is the time left on the holder's
//     lease. Aborted is the code gRPC reserves for "retry at a higher
//     level", which is what the client should do.
//   - The key was used with a different request (another method, or
//     another payload): FailedPrecondition, with an
//     errdetails.PreconditionFailure naming the key. Not InvalidArgument:
//     gRPC's guide keeps InvalidArgument for arguments that are wrong
//     "regardless of the state of the system", and this request is fine in
//     itself; it is rejected because of what the server did earlier with
//     this key, and the same request with a fresh key succeeds. Retrying the
//     same call gives the same answer until the key leaves the window.
//   - The store cannot be reached: Unavailable, and the handler does not run
//     (the Guard fails closed). Unavailable is retryable by gRPC's retry
//     policy, and the retry carries the same key. Its message is fixed: the
//     store's error, which may name internal hosts, goes to
//     Options.OnStoreError only.
//   - A key is malformed, or required but missing: InvalidArgument.
//   - The caller's context ended before the key could be claimed:
//     Canceled or DeadlineExceeded, and the handler does not run; a claim
//     the store granted meanwhile is given back (if that fails, the key
//     stays blocked until its lease ends, and OnStoreError is told).
//     See also The client goes away.
//   - The handler ran but its lease was taken over before its result was
//     stored (ErrLeaseLost): its response is sent, and not stored. A
//     handler that stopped because the Guard ended its context (the claim
//     was taken over, or could not be renewed) and returned that context's
//     error is answered Aborted (taken over) or Unavailable (not renewed),
//     not Canceled: the caller did not cancel, and should retry with the
//     same key.
//   - The handler ran but its result could not be stored, or its key
//     released: its answer is sent, and Options.OnStoreError is told (the
//     Guard's error wraps idempotency.ErrNotStored or
//     idempotency.ErrNotReleased, which the interceptor goes by); a retry
//     after the lease may run the handler again (fence the side effect
//     downstream with idempotency.TokenFrom).
//
// # The client goes away
//
// gRPC cancels a handler's context when its client cancels the call or the
// call's deadline passes. A handler that stops then answers Canceled or
// DeadlineExceeded, which is not stored: the claim is kept until its lease
// ends, since the handler may have done part of its work, and a retry
// after that runs the handler again. So does an answer with a code of
// Options.ReleaseCodes given once the handler's context had ended (by the
// client, or by the Guard's Timeout): a downstream call cut short by the
// context answers Unavailable or Aborted whether or not it was applied,
// which is no refusal made before the work. Any other answer is handled as
// always: a response, or with StoreErrors an error, is stored and replayed
// to the retry. Options.Detach gives guarded handlers
// a context that the client's cancellation and deadline do not reach (the
// Guard still ends it when the claim is lost, or at Guard.Timeout, which
// should then be set): the operation finishes, its answer is stored, and
// the retry replays it. A handler that finishes after its client went away,
// detached or not, may still set header and trailer metadata: gRPC refuses
// it on the closed stream, so the interceptor keeps it for the stored
// answer and reports success to the handler.
//
// # Handler errors
//
// A handler error whose code is in Options.ReleaseCodes (default
// Unavailable, ResourceExhausted and Aborted: codes a handler returns when
// it refused the work before doing it) releases the key at once, so the
// retry runs the handler again, unless the handler's context had ended
// when it returned (see The client goes away). Any other error keeps the
// claim until its lease ends, as after a crash: the handler may have had
// side effects, and a retry inside the lease is answered Aborted. With
// Options.StoreErrors, those other errors are stored instead and replayed,
// code, message, details, header and trailer metadata, to every retry
// inside the window, like a response; Canceled and DeadlineExceeded never
// are (they keep the claim).
//
// # Panics and runtime.Goexit
//
// A handler that panics, or calls runtime.Goexit (t.FailNow in a test
// handler, a library that stops its goroutine so), may have done its work
// before it stopped: nothing is stored, and the claim is kept until its
// lease ends, as for an Internal error; a retry inside the lease is
// answered Aborted, one after it runs the handler again. The panic goes on
// as it was raised. gRPC does not recover it: the process ends, unless a
// recovery interceptor does. Placed before this one, the recovery
// interceptor answers the call (Internal, as a rule) and the claim is kept;
// placed after it, it turns the panic into an error before this one sees
// it, handled as above: with its usual Internal, the claim is kept too, or
// the error is stored with StoreErrors. Either way a recovered panic does
// not let the retry run the handler again at once; the order of the
// interceptors only decides whether the Internal answer is stored. Nothing
// a gRPC handler does before it returns says that its work is done (header
// metadata sent with grpc.SendHeader says nothing of it), so the claim is
// kept whether or not it sent any. Goexit ends the call without an answer:
// gRPC never answers it, and the client waits until its deadline. To have
// the key released after a panic or Goexit instead, so that the retry runs
// the handler at once, put Internal in Options.ReleaseCodes (which releases
// it after an Internal error as well). (Builds before this rule released
// the key after a panic or Goexit, whatever ReleaseCodes held.)
//
// # Client
//
// UnaryClientInterceptor attaches a fresh key (128 random bits, base64url)
// to each guarded call that carries none. A caller that retries by itself
// puts the key in the context once, with WithKey or EnsureKey, and reuses
// that context for every attempt. gRPC's own retry policy (service config
// retryPolicy) and transparent retries run below the interceptors: the
// interceptor runs once per logical call, and every attempt resends the same
// metadata, hence the same key. A retrying client interceptor (such as
// go-grpc-middleware's retry) is another matter: it calls the interceptors
// chained after it once per attempt, so chain this one before it, or each
// attempt gets a fresh key and is a new operation. Hedged attempts (a hedgingPolicy, which
// clients in other languages implement) run at the same time with the same
// key: all but the first are answered Aborted while it runs, so list
// ABORTED in the policy's nonFatalStatusCodes, or the first such answer
// ends the call.
package idemgrpc
