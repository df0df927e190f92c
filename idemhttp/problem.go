package idemhttp

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// ProblemBase is the prefix of every problem type URI this package writes.
// The URIs are identifiers (RFC 9457 section 3.1.1): stable across
// releases, compared as strings, not necessarily dereferenceable.
const ProblemBase = "https://archlab.dev/idempotency/problems/"

// Problem is an RFC 9457 problem detail, written as application/problem+json.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// OriginalStatus is the status of the response that could not be
	// replayed (response-not-replayable only).
	OriginalStatus int `json:"original_status,omitempty"`
}

// The problems the middleware answers with. Type and Title are stable;
// Detail says what was wrong with this request, or what to do about it
// (its wording may change).
var (
	// ProblemMissingKey (400): Options.Required is set and the request has
	// no Idempotency-Key. Nothing ran.
	ProblemMissingKey = Problem{Type: ProblemBase + "missing-key", Title: "Idempotency-Key is required", Status: http.StatusBadRequest,
		Detail: "send an Idempotency-Key header field with a key unique to this request (a UUID, for example), and the same key with each retry of it"}
	// ProblemInvalidKey (400): the Idempotency-Key field is not one key of
	// 1-255 visible ASCII characters (see ParseKey). Nothing ran.
	ProblemInvalidKey = Problem{Type: ProblemBase + "invalid-key", Title: "Idempotency-Key is invalid", Status: http.StatusBadRequest}
	// ProblemBodyUnreadable (400): the request body could not be read to
	// fingerprint it. Nothing ran.
	ProblemBodyUnreadable = Problem{Type: ProblemBase + "body-unreadable", Title: "Request body could not be read", Status: http.StatusBadRequest}
	// ProblemBodyTooLarge (413): the body exceeds Options.MaxBody. Nothing ran.
	ProblemBodyTooLarge = Problem{Type: ProblemBase + "request-too-large", Title: "Request body too large for an idempotent request", Status: http.StatusRequestEntityTooLarge}
	// ProblemInFlight (409, with Retry-After): a request with this key is
	// being processed. Retry after the given seconds.
	ProblemInFlight = Problem{Type: ProblemBase + "in-flight", Title: "A request with this Idempotency-Key is being processed", Status: http.StatusConflict,
		Detail: "the first request with this key has not finished: retry with the same key after the seconds in Retry-After"}
	// ProblemKeyReused (422, or 409 with Options.ConflictStatus): the key
	// was first used for another request (method, path, query, selected
	// headers or body differ). Use a new key for a new request.
	ProblemKeyReused = Problem{Type: ProblemBase + "key-reused", Title: "Idempotency-Key was used for a different request", Status: http.StatusUnprocessableEntity}
	// ProblemUnavailable (503, with Retry-After): the idempotency store
	// could not answer; the request did not run. Retrying is safe.
	ProblemUnavailable = Problem{Type: ProblemBase + "store-unavailable", Title: "Idempotency store unavailable", Status: http.StatusServiceUnavailable,
		Detail: "the request did not run: retry with the same key after the seconds in Retry-After"}
	// ProblemNotReplayable (409): the request ran, but its response was
	// larger than Options.MaxStoredResponse, or was cut short when the
	// client went away (see the package doc), and cannot be replayed. It
	// will not run again inside the window.
	ProblemNotReplayable = Problem{Type: ProblemBase + "response-not-replayable", Title: "Response cannot be replayed", Status: http.StatusConflict}
)

// WriteProblem writes p as application/problem+json with p.Status.
func WriteProblem(w http.ResponseWriter, p Problem) {
	b, err := json.Marshal(p)
	if err != nil { // cannot happen: Problem holds strings and ints
		b = []byte(`{"title":"internal error"}`)
	}
	b = append(b, '\n')
	h := w.Header()
	h["Content-Type"] = []string{"application/problem+json"}
	h["Content-Length"] = []string{strconv.Itoa(len(b))}
	h["Cache-Control"] = []string{"no-store"}
	w.WriteHeader(p.Status)
	_, _ = w.Write(b)
}
