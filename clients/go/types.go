package idemd

import (
	"errors"
	"fmt"
	"time"

	idemdv1 "github.com/idemd/idemd/clients/go/gen/idemd/v1"
)

// HTTPRequest is the request whose fingerprint identifies an operation: the
// same key with a different request is refused (KeyReuseError).
type HTTPRequest struct {
	Method      string
	Path        string // hashed byte for byte; include the query string or not, but consistently
	ContentType string // application/json and +json bodies are canonicalized
	Body        []byte
	// IgnoreFields are RFC 6901 pointers of volatile JSON fields (client
	// timestamps, nonces) left out of the fingerprint.
	IgnoreFields []string
}

func (r HTTPRequest) proto() *idemdv1.HttpRequest {
	return &idemdv1.HttpRequest{
		Method:       r.Method,
		Path:         r.Path,
		Body:         r.Body,
		ContentType:  r.ContentType,
		IgnoreFields: r.IgnoreFields,
	}
}

// Header is one response header; order and repeats are kept.
type Header struct {
	Name  string
	Value string
}

// Response is what a handler produced, stored by idemd and replayed byte for
// byte to every retry.
type Response struct {
	Status  int
	Headers []Header
	Body    []byte
	// BodyRef optionally points to a body kept elsewhere (object storage),
	// for responses larger than the endpoint's max_response_bytes.
	BodyRef string
}

func (r *Response) proto() *idemdv1.StoredResponse {
	headers := make([]*idemdv1.Header, len(r.Headers))
	for i, h := range r.Headers {
		headers[i] = &idemdv1.Header{Name: h.Name, Value: h.Value}
	}
	status := r.Status
	if status < 0 {
		status = 0 // refused by the server as out of range
	}
	return &idemdv1.StoredResponse{Status: uint32(status), Headers: headers, Body: r.Body, BodyRef: r.BodyRef}
}

// ResponseFromProto converts a stored response of the raw API.
func ResponseFromProto(p *idemdv1.StoredResponse) *Response {
	if p == nil {
		return nil
	}
	headers := make([]Header, len(p.GetHeaders()))
	for i, h := range p.GetHeaders() {
		headers[i] = Header{Name: h.GetName(), Value: h.GetValue()}
	}
	return &Response{Status: int(p.GetStatus()), Headers: headers, Body: p.GetBody(), BodyRef: p.GetBodyRef()}
}

// Result is the outcome of ExecuteOnce.
type Result struct {
	// Response is the handler's response (Replayed false) or the stored
	// response of an earlier execution (Replayed true).
	Response *Response
	// Replayed is true when the handler did not run because the operation
	// completed earlier; HTTP front ends answer "Idempotent-Replayed: true".
	Replayed bool
	// Attempt is the attempt number of the claim the handler ran under (1 for
	// the first execution, incremented by every takeover); 0 when replayed.
	Attempt uint32
}

// KeyReuseError: the key was used earlier with a different request. HTTP 422
// idempotency_key_reuse. Permanent: never retry it with this key.
type KeyReuseError struct {
	HTTPStatus  int    // 422
	ErrorCode   string // "idempotency_key_reuse"
	Fingerprint []byte // the digest the server compared
}

func (e *KeyReuseError) Error() string {
	return fmt.Sprintf("idemd: idempotency key reused with a different request (%d %s)", e.HTTPStatus, e.ErrorCode)
}

// OutcomePendingError: an earlier execution's outcome is undecided (it failed
// ambiguously, failed definitively, or its lease expired). HTTP 409
// outcome_pending. Never re-executed: it needs reconciliation.
type OutcomePendingError struct {
	HTTPStatus int    // 409
	ErrorCode  string // "outcome_pending"
	State      idemdv1.State
	Reason     string
}

func (e *OutcomePendingError) Error() string {
	return fmt.Sprintf("idemd: outcome of an earlier execution is pending (%d %s, state %s): %s",
		e.HTTPStatus, e.ErrorCode, e.State, e.Reason)
}

// InProgressError: another execution still held the key when the wait budget
// ran out. HTTP 409 request_in_progress; retry after RetryAfter.
type InProgressError struct {
	HTTPStatus     int    // 409
	ErrorCode      string // "request_in_progress"
	RetryAfter     time.Duration
	LeaseExpiresAt time.Time
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("idemd: request still in progress (%d %s), retry after %s",
		e.HTTPStatus, e.ErrorCode, e.RetryAfter)
}

// CompleteError: the handler produced Response (its side effect happened) but
// idemd did not store it, e.g. because the lease was taken over (LEASE_LOST)
// or the response was refused. Err is the gRPC error.
type CompleteError struct {
	Response *Response
	Err      error
}

func (e *CompleteError) Error() string {
	return "idemd: the handler's response could not be stored: " + e.Err.Error()
}

func (e *CompleteError) Unwrap() error { return e.Err }

// ErrLeaseLost is the cause of the handler context's cancellation when the
// executor could not extend the lease because another caller took it over.
var ErrLeaseLost = errors.New("idemd: lease lost")

// NoSideEffectError marks a handler error that happened before any side
// effect: the executor releases the key (Fail RELEASE) so that a retry
// executes again.
type NoSideEffectError struct{ Err error }

func (e *NoSideEffectError) Error() string { return e.Err.Error() }
func (e *NoSideEffectError) Unwrap() error { return e.Err }

// NoSideEffect marks err as "failed before any side effect happened". A
// handler returns it (e.g. the card was declined by validation before any
// call went out); the executor then releases the key instead of recording an
// unknown outcome. Returns nil for nil.
func NoSideEffect(err error) error {
	if err == nil {
		return nil
	}
	return &NoSideEffectError{Err: err}
}

// IsNoSideEffect reports whether err is marked by NoSideEffect.
func IsNoSideEffect(err error) bool {
	var n *NoSideEffectError
	return errors.As(err, &n)
}
