package idemgrpc

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/archlab/idempotency"
	"github.com/archlab/idempotency/internal/certid"
	"github.com/archlab/idempotency/internal/keepclaim"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"
)

// MetadataKey is the metadata field that carries the idempotency key.
const MetadataKey = "idempotency-key"

// ReplayedKey is the header metadata field set to "true" on a replay.
const ReplayedKey = "idempotency-replayed"

// MaxKeyLen is the longest key accepted, in bytes.
const MaxKeyLen = 255

// typeField holds the response's full type name in the stored header. Its
// leading colon makes it an invalid metadata key, so no handler header can
// collide with it.
const typeField = ":type"

// trailerPrefix marks a trailer field in the stored header, invalid as a
// metadata key for the same reason.
const trailerPrefix = ":trailer:"

// Options configure UnaryServerInterceptor; nil means all defaults.
type Options struct {
	// Methods reports whether a full method name ("/pkg.Service/Method") is
	// guarded. nil guards every unary method.
	Methods func(fullMethod string) bool
	// KeyFunc returns the key of a request, for APIs with an AIP-155
	// request_id field. A key it returns wins over the metadata's (which the
	// client interceptor makes fresh for each call); "" means the metadata
	// decides. nil: keys come from metadata only.
	KeyFunc func(ctx context.Context, req any) string
	// Scope returns a namespace for the caller (a tenant, an authenticated
	// principal), so that two callers choosing the same key do not collide
	// and one caller's result is never replayed to another. nil:
	// DefaultScope, the caller's "authorization" metadata or, without one,
	// its TLS client certificate's identity.
	Scope func(ctx context.Context) string
	// Required rejects guarded calls without a key (InvalidArgument). When
	// false (the default) they run unguarded.
	Required bool
	// NewResponse returns an empty response message for a method, for
	// replays of types that are not in protoregistry.GlobalTypes. nil: the
	// stored type name is looked up in the global registry.
	NewResponse func(fullMethod string) proto.Message
	// ReleaseCodes are the handler error codes that release the key at
	// once, when the handler returns them before its context ended (after
	// the client went away or the Guard's Timeout passed, they keep the
	// claim until its lease ends). nil: Unavailable, ResourceExhausted,
	// Aborted. An empty non-nil slice releases on none. Internal in it also
	// releases the key after a handler that panicked or called
	// runtime.Goexit, which otherwise keeps the claim.
	ReleaseCodes []codes.Code
	// StoreErrors stores handler errors whose code is not in ReleaseCodes
	// and replays them. When false (the default) such an error keeps the
	// claim until its lease ends and is not stored. Canceled and
	// DeadlineExceeded are never stored: they say what happened to the call
	// (the client left, its deadline passed), not how the operation ended,
	// which may still have had effects; the claim is kept.
	StoreErrors bool
	// OnStoreError (nil: none) is called, before the call is answered, for
	// each store failure: the key could not be claimed (the call is
	// answered Unavailable and the handler does not run), or, after the
	// handler ran, its result could not be stored, its key could not be
	// released, or its lease could not be renewed. After the handler ran
	// the client still gets the handler's answer (except that a handler
	// stopped by a lost lease is answered Aborted or Unavailable), but a
	// retry may run the handler again. err says which of these failed and
	// wraps the store's error (errors.Is works), and the Guard's sentinel:
	// idempotency.ErrNotStored when the result could not be stored,
	// idempotency.ErrNotReleased when the key could not be released. It
	// wraps idempotency.ErrLeaseLost when the claim had been taken over or
	// deleted (before the result was stored, or while a handler that failed
	// ran, or before its key was released). The errors of the renewals
	// themselves go to the Guard's OnRenew, and a Release after a handler
	// that panicked or called runtime.Goexit (with Internal in
	// ReleaseCodes) is not reported. A call whose caller left (cancelled,
	// or its deadline passed) while its key was claimed is answered
	// Canceled or DeadlineExceeded; a claim granted meanwhile is given back,
	// and if that fails (the key then stays blocked until its lease ends)
	// it is reported as a failed release. The client gets a fixed message, never
	// the error's text, which may name internal addresses; log it here.
	OnStoreError func(ctx context.Context, fullMethod string, err error)
	// Detach runs guarded handlers with a context that the client's
	// cancellation and deadline do not reach, so that an operation started
	// is finished and its answer stored for the retry, which replays it.
	// The Guard still ends the context when the claim is lost, and at
	// Guard.Timeout: set one, since the client's deadline no longer bounds
	// the handler (nor the calls it makes with its context). When false
	// (the default) a handler that stops because its client went away
	// answers Canceled or DeadlineExceeded, which is not stored: the claim
	// is kept until its lease ends, and a retry after that runs the handler
	// again, whatever part of its work it had done.
	Detach bool
}

var defaultReleaseCodes = []codes.Code{codes.Unavailable, codes.ResourceExhausted, codes.Aborted}

type server struct {
	guard   *idempotency.Guard
	opts    Options
	release [32]bool // indexed by code; gRPC codes are below 17
}

// UnaryServerInterceptor returns an interceptor that runs guarded unary
// methods through guard. Requests and responses must be protobuf messages.
// It fails with idempotency.ErrInvalidConfig when guard is nil or invalid,
// or when Options.ReleaseCodes holds a code gRPC does not define.
func UnaryServerInterceptor(guard *idempotency.Guard, opts *Options) (grpc.UnaryServerInterceptor, error) {
	if guard == nil {
		return nil, fmt.Errorf("%w: idemgrpc: nil Guard", idempotency.ErrInvalidConfig)
	}
	if err := guard.Validate(); err != nil {
		return nil, err
	}
	s := &server{guard: guard}
	if opts != nil {
		s.opts = *opts
	}
	rc := s.opts.ReleaseCodes
	if rc == nil {
		rc = defaultReleaseCodes
	}
	for _, c := range rc {
		if c > codes.Unauthenticated { // the last code gRPC defines
			return nil, fmt.Errorf("%w: idemgrpc: unknown code %d in ReleaseCodes", idempotency.ErrInvalidConfig, c)
		}
		s.release[c] = true
	}
	return s.intercept, nil
}

func (s *server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	method := info.FullMethod
	if s.opts.Methods != nil && !s.opts.Methods(method) {
		return handler(ctx, req)
	}
	key, err := s.key(ctx, req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if key == "" {
		if s.opts.Required {
			return nil, status.Errorf(codes.InvalidArgument, "idemgrpc: %s requires an %s", method, MetadataKey)
		}
		return handler(ctx, req)
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "idemgrpc: request %T is not a protobuf message", req)
	}
	fp, err := fingerprint(method, msg)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "idemgrpc: encode request: %v", err)
	}
	storeKey := key
	if s.opts.Scope != nil {
		storeKey = s.opts.Scope(ctx) + "\x00" + key
	} else if scope := DefaultScope(ctx); scope != "" {
		// Callers without credentials keep the bare key.
		storeKey = scope + "\x00" + key
	}

	// gctx is what the Guard runs under: the call's context, or with Detach
	// the same without its cancellation and deadline.
	gctx := ctx
	if s.opts.Detach {
		if cerr := ctx.Err(); cerr != nil {
			return nil, status.FromContextError(cerr).Err()
		}
		gctx = context.WithoutCancel(ctx)
	}
	var reply any
	var herr error
	var fe *fnError // what the handler's side gave the Guard
	var cut bool    // the Guard, not the caller, ended the handler's context, for its lease
	res, err := s.guard.Run(gctx, storeKey, fp, func(cctx context.Context) (idempotency.Response, error) {
		hctx := cctx
		cs := &captureStream{ServerTransportStream: grpc.ServerTransportStreamFromContext(cctx), call: ctx}
		if cs.ServerTransportStream != nil {
			hctx = grpc.NewContextWithServerTransportStream(cctx, cs)
		}
		returned := false
		defer func() {
			if !returned && !s.release[codes.Internal] {
				// The handler panicked or called runtime.Goexit, maybe
				// after its side effect: the claim is kept until its
				// lease ends, as for the Internal error a recovery
				// interceptor makes of a panic (see doc.go).
				if f := keepclaim.From(cctx); f != nil {
					f.Set()
				}
			}
		}()
		reply, herr = handler(hctx, req)
		returned = true
		// A lost lease or a lease run out ends cctx with Canceled; the
		// Guard's Timeout with DeadlineExceeded, which is no store failure
		// and reaches the caller as the handler answers it.
		cut = errors.Is(cctx.Err(), context.Canceled) && gctx.Err() == nil
		// A handler whose context ended (its client went away, or the
		// Guard's Timeout) gave up partway, whatever code it answers.
		ended := cctx.Err() != nil || gctx.Err() != nil
		resp, eerr := s.encode(reply, herr, cs.header(), ended)
		if eerr != nil {
			fe = &fnError{eerr}
			return resp, fe
		}
		return resp, nil
	})
	switch res.Outcome {
	case idempotency.Executed:
		if s.opts.OnStoreError != nil {
			s.reportExecuted(ctx, method, err, fe, cut)
		}
		// Sent whether or not the result could be stored: the handler ran.
		if cut && statusOf(herr).Code() == codes.Canceled {
			// The handler gave up because its claim went, not because the
			// caller cancelled: Canceled would tell the caller it did.
			if errors.Is(err, idempotency.ErrLeaseLost) {
				return nil, status.Error(codes.Aborted, "idemgrpc: the claim on the idempotency key was taken over while the handler ran; retry with the same key")
			}
			return nil, status.Error(codes.Unavailable, "idemgrpc: the claim on the idempotency key could not be renewed while the handler ran; retry with the same key")
		}
		return reply, herr
	case idempotency.Replayed:
		return s.replay(ctx, method, res.Response)
	case idempotency.InFlight:
		return nil, inFlight(s.now(), res.LeaseUntil)
	case idempotency.Conflicted:
		st, _ := status.New(codes.FailedPrecondition, "idemgrpc: idempotency key reused with a different request").
			WithDetails(&errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{
				Type: "IDEMPOTENCY_KEY", Subject: key,
				Description: "the key was first used with another method or payload; use a fresh key",
			}}})
		return nil, st.Err()
	default:
		if cerr := gctx.Err(); cerr != nil {
			// The caller left while the key was claimed. The Guard gave a
			// claim granted meanwhile back; if that failed its error wraps
			// ErrNotReleased: the key then stays blocked until its lease
			// ends, which is the store's failure (the caller's leaving is
			// not, and is left out of the report).
			if e := guardPart(err, idempotency.ErrNotReleased, nil); e != nil && s.opts.OnStoreError != nil {
				s.opts.OnStoreError(ctx, method, fmt.Errorf("idemgrpc: could not release the key: %w", e))
			}
			return nil, status.FromContextError(cerr).Err()
		}
		if s.opts.OnStoreError != nil {
			s.opts.OnStoreError(ctx, method, fmt.Errorf("idemgrpc: could not claim the key: %w", err))
		}
		return nil, status.Error(codes.Unavailable, "idemgrpc: the idempotency store is unavailable; retry with the same key later")
	}
}

// fnError marks the error the handler's side gave the Guard, so that what
// the Guard adds to it, a store's error, can be told apart from it.
type fnError struct{ err error }

func (e *fnError) Error() string { return e.err.Error() }
func (e *fnError) Unwrap() error { return e.err }

// reportExecuted tells OnStoreError of the store failures of a call whose
// handler ran. err is the Guard's error, fe the handler side's (nil if
// none), cut whether the Guard ended the handler's context. The Guard
// returns an error wrapping ErrNotStored when the handler's answer could
// not be stored; otherwise err is fe, alone when the store did its part,
// or joined with an error wrapping ErrNotReleased when the key could not
// be given back, or with one wrapping ErrLeaseLost when the claim was lost
// while the handler ran. fe's own errors are the handler's, never the
// store's, whatever they wrap.
func (s *server) reportExecuted(ctx context.Context, method string, err error, fe *fnError, cut bool) {
	if cut && !errors.Is(err, idempotency.ErrLeaseLost) {
		// The lease ran out while renewals failed; their errors went to
		// the Guard's OnRenew.
		s.opts.OnStoreError(ctx, method, fmt.Errorf("idemgrpc: could not renew the lease: %w: the handler's context was ended before another caller could take the key over", idempotency.ErrUnavailable))
	}
	switch {
	case err == nil:
	case fe == nil || !errors.Is(err, fe):
		// ErrNotStored: the handler's answer was sent, and not stored.
		s.opts.OnStoreError(ctx, method, fmt.Errorf("idemgrpc: could not store the result: %w", err))
	default:
		if e := guardPart(err, idempotency.ErrNotReleased, fe); e != nil {
			s.opts.OnStoreError(ctx, method, fmt.Errorf("idemgrpc: could not release the key: %w", e))
		} else if e := guardPart(err, idempotency.ErrLeaseLost, fe); e != nil {
			s.opts.OnStoreError(ctx, method, fmt.Errorf("idemgrpc: the key was taken over or deleted while the handler ran: %w", e))
		}
	}
}

// guardPart returns the part of the Guard's error err that wraps target
// (a sentinel) and not fe (the handler side's error, nil if none), or nil
// if none does. The Guard joins what it has to say to an error that is not
// the store's (the handler's, or the one about the caller's context), and
// only the former is a store failure to report.
func guardPart(err, target error, fe *fnError) error {
	if !errors.Is(err, target) {
		return nil
	}
	parts := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		parts = j.Unwrap()
	}
	for _, e := range parts {
		if errors.Is(e, target) && (fe == nil || !errors.Is(e, fe)) {
			return e
		}
	}
	return nil
}

func (s *server) now() time.Time {
	if s.guard.Now != nil {
		return s.guard.Now()
	}
	return time.Now()
}

func (s *server) key(ctx context.Context, req any) (string, error) {
	// The request's own key comes first: the client interceptor attaches a
	// fresh metadata key to every call, which would make each retry with
	// the same request_id a new operation.
	var key string
	source := "the request's idempotency key" // what the client is told to fix
	if s.opts.KeyFunc != nil {
		key = s.opts.KeyFunc(ctx, req)
	}
	if vals := metadata.ValueFromIncomingContext(ctx, MetadataKey); key == "" && len(vals) > 0 {
		source = MetadataKey
		if len(vals) > 1 {
			return "", errors.New("idemgrpc: more than one " + MetadataKey)
		}
		key = vals[0]
		if key == "" {
			return "", errors.New("idemgrpc: empty " + MetadataKey)
		}
	}
	if len(key) > MaxKeyLen {
		return "", fmt.Errorf("idemgrpc: %s longer than %d bytes", source, MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return "", fmt.Errorf("idemgrpc: %s holds a character that is not visible ASCII", source)
		}
	}
	return key, nil
}

// fingerprint hashes the method and the deterministic encoding of the
// request. The method is length-prefixed so that no two (method, payload)
// pairs share an input.
func fingerprint(method string, req proto.Message) (string, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%d:%s", len(method), method)
	h.Write(b)
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])), nil
}

// DefaultScope namespaces keys by the caller's credentials, as a truncated
// SHA-256 so that no credential reaches the store: its "authorization"
// metadata (what gRPC's per-RPC credentials send), or, for a call without
// one, the identity in its TLS client certificate (mTLS, as between
// services): the certificate's issuer, subject and alternative names, which
// stay the same when the certificate is renewed (the issuer counts, so the
// same names from two trusted CAs are two callers). Calls with neither
// share the anonymous scope "". A retry made after the caller's token was
// renewed is in another scope and runs again; set Options.Scope to the
// authenticated principal (from an auth interceptor's context value) to
// avoid that, and when callers are told apart otherwise.
func DefaultScope(ctx context.Context) string {
	h := sha256.New()
	prefix := "auth:"
	if auth := metadata.ValueFromIncomingContext(ctx, "authorization"); len(auth) > 0 {
		for _, a := range auth {
			h.Write([]byte(a))
			h.Write([]byte{'\n'})
		}
	} else if c := peerCertificate(ctx); c != nil {
		prefix = "tls:"
		h.Write(certid.Append(nil, c))
	} else {
		return ""
	}
	var sum [sha256.Size]byte
	return prefix + hex.EncodeToString(h.Sum(sum[:0])[:16])
}

// peerCertificate returns the caller's TLS client certificate, or nil.
func peerCertificate(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return nil
	}
	return ti.State.PeerCertificates[0]
}

// statusOf is the status gRPC's server sends for a handler's error: an
// error that is not a status but a context's error (ctx.Err(), maybe
// wrapped) is Canceled or DeadlineExceeded, not Unknown.
func statusOf(err error) *status.Status {
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	return st
}

// encode turns a handler's answer into what the Guard stores, or into the
// error that tells the Guard not to store it. ended says the handler's
// context had ended when it returned.
func (s *server) encode(reply any, herr error, header metadata.MD, ended bool) (idempotency.Response, error) {
	if herr != nil {
		st := statusOf(herr)
		if int(st.Code()) < len(s.release) && s.release[st.Code()] {
			if ended {
				// Not a refusal made before the work: a downstream call
				// cut short by the context says Unavailable or Aborted
				// whether or not it was applied. Kept, not stored.
				return idempotency.Response{}, herr
			}
			return idempotency.Response{}, idempotency.Retryable(herr)
		}
		if !s.opts.StoreErrors || st.Code() == codes.OK || st.Code() == codes.Canceled || st.Code() == codes.DeadlineExceeded {
			return idempotency.Response{}, herr
		}
		b, err := proto.Marshal(st.Proto())
		if err != nil {
			return idempotency.Response{}, herr
		}
		return idempotency.Response{Status: int(st.Code()), Header: header, Body: b}, nil
	}
	m, ok := reply.(proto.Message)
	if !ok {
		// Nothing is stored; the claim is kept until its lease ends.
		return idempotency.Response{}, fmt.Errorf("idemgrpc: response %T is not a protobuf message", reply)
	}
	b, err := proto.Marshal(m)
	if err != nil {
		return idempotency.Response{}, fmt.Errorf("idemgrpc: encode response: %w", err)
	}
	if header == nil {
		header = make(map[string][]string, 1)
	}
	header[typeField] = []string{string(m.ProtoReflect().Descriptor().FullName())}
	return idempotency.Response{Status: int(codes.OK), Header: header, Body: b}, nil
}

func (s *server) replay(ctx context.Context, method string, r idempotency.Response) (any, error) {
	md := metadata.MD{}
	var trailer metadata.MD
	var typeName string
	for k, v := range r.Header {
		switch {
		case k == typeField:
			if len(v) > 0 {
				typeName = v[0]
			}
		case strings.HasPrefix(k, trailerPrefix):
			if trailer == nil {
				trailer = metadata.MD{}
			}
			trailer[k[len(trailerPrefix):]] = v
		default:
			md[k] = v
		}
	}
	md.Set(ReplayedKey, "true")
	if err := grpc.SetHeader(ctx, md); err != nil {
		return nil, status.Errorf(codes.Internal, "idemgrpc: replay header: %v", err)
	}
	if trailer != nil {
		if err := grpc.SetTrailer(ctx, trailer); err != nil {
			return nil, status.Errorf(codes.Internal, "idemgrpc: replay trailer: %v", err)
		}
	}
	if codes.Code(r.Status) != codes.OK {
		sp := &spb.Status{}
		if err := proto.Unmarshal(r.Body, sp); err != nil {
			return nil, status.Errorf(codes.Internal, "idemgrpc: decode stored status: %v", err)
		}
		return nil, status.FromProto(sp).Err()
	}
	var out proto.Message
	if s.opts.NewResponse != nil {
		out = s.opts.NewResponse(method)
	}
	if out == nil {
		mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(typeName))
		if err != nil {
			return nil, status.Errorf(codes.Internal, "idemgrpc: stored response type %q: %v", typeName, err)
		}
		out = mt.New().Interface()
	}
	if err := proto.Unmarshal(r.Body, out); err != nil {
		return nil, status.Errorf(codes.Internal, "idemgrpc: decode stored response: %v", err)
	}
	return out, nil
}

// inFlight is the answer while another call holds the key: Aborted, with the
// time left on the holder's lease as the retry delay (at least 1ms, so a
// client never spins).
func inFlight(now, leaseUntil time.Time) error {
	d := max(leaseUntil.Sub(now), time.Millisecond)
	st, _ := status.New(codes.Aborted, "idemgrpc: a call with this idempotency key is in flight").
		WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
	return st.Err()
}

// captureStream records the header and trailer metadata a handler sets,
// trailer fields under trailerPrefix, and forwards everything to the real
// stream.
//
// Once the client has gone (call is done), gRPC refuses metadata on the
// closed stream. The handler may be finishing work whose answer is stored
// for the retry, and a handler that fails on that error (as handlers are
// told to check it) would lose the stored answer, and have the retry run
// it again. So the metadata is recorded, and the refusal hidden, as long
// as gRPC would have taken it from a live stream (no header after
// SendHeader).
type captureStream struct {
	grpc.ServerTransportStream
	call context.Context // the call's own context, done when the client has gone
	mu   sync.Mutex
	md   metadata.MD
	sent bool // SendHeader was called
}

// forward gives the real stream's answer to a metadata call, or nil if it
// failed only because the client has gone. It reports whether md is to be
// recorded.
func (c *captureStream) forward(err error, header bool) (bool, error) {
	c.mu.Lock()
	sent := c.sent
	c.mu.Unlock()
	if err == nil {
		return true, nil
	}
	if c.call.Err() == nil || header && sent {
		return false, err
	}
	return true, nil
}

func (c *captureStream) add(prefix string, md metadata.MD) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.md == nil {
		c.md = metadata.MD{}
	}
	for k, v := range md {
		c.md[prefix+k] = append(c.md[prefix+k], v...)
	}
}

func (c *captureStream) header() metadata.MD {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.md == nil {
		return nil
	}
	out := make(metadata.MD, len(c.md)+1)
	for k, v := range c.md {
		out[k] = slices.Clone(v)
	}
	return out
}

func (c *captureStream) SetHeader(md metadata.MD) error {
	keep, err := c.forward(c.ServerTransportStream.SetHeader(md), true)
	if keep {
		c.add("", md)
	}
	return err
}

func (c *captureStream) SendHeader(md metadata.MD) error {
	keep, err := c.forward(c.ServerTransportStream.SendHeader(md), true)
	if keep {
		c.add("", md)
	}
	c.mu.Lock()
	c.sent = true
	c.mu.Unlock()
	return err
}

func (c *captureStream) SetTrailer(md metadata.MD) error {
	keep, err := c.forward(c.ServerTransportStream.SetTrailer(md), false)
	if keep {
		c.add(trailerPrefix, md)
	}
	return err
}
