package idemd

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	idemdv1 "github.com/idemd/idemd/clients/go/gen/idemd/v1"
)

const (
	// DefaultMaxWait is how long ExecuteOnce waits for an in-flight duplicate.
	DefaultMaxWait = 5 * time.Second
	// DefaultTransportRetries is how often a call is retried after a transport
	// error (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED).
	DefaultTransportRetries = 4

	initialBackoff = 50 * time.Millisecond
	maxBackoff     = 1 * time.Second
	maxReasonBytes = 1024
	minLeaseTick   = 10 * time.Millisecond
)

// Handler runs the side effect of an operation. It returns the response to
// store and replay, or an error: wrap it with NoSideEffect when nothing
// happened (the key is released), otherwise the outcome is recorded as
// unknown. ctx is cancelled with cause ErrLeaseLost if another caller takes
// the key over. ex says which operation and attempt it runs; a third-party
// call takes its idempotency key from ex.DownstreamKey.
type Handler func(ctx context.Context, ex Execution) (*Response, error)

// Execution is what a Handler is told about the execution it runs.
type Execution struct {
	// Endpoint is the logical endpoint, e.g. "POST /v1/payments".
	Endpoint string
	// Key is the client's idempotency key.
	Key string
	// Attempt is 1 for the first execution of the key, incremented on every
	// takeover (an earlier holder's lease expired): a handler seeing more
	// than 1 may find that a previous attempt got part of the way.
	Attempt uint32
}

// DownstreamKey is the idempotency key to send to a third party for step:
// the same on every retry of this operation, different for every step (see
// the package function DownstreamKey).
func (ex Execution) DownstreamKey(step string) string { return DownstreamKey(ex.Key, step) }

type executeOptions struct {
	maxWait          time.Duration
	localFingerprint bool
	lease            time.Duration
	ttl              time.Duration
	transportRetries int
}

// ExecuteOption configures one ExecuteOnce call.
type ExecuteOption func(*executeOptions)

// WithMaxWait bounds how long ExecuteOnce waits for an in-flight duplicate
// to finish (server-side wait, then retries) before InProgressError.
// Default DefaultMaxWait; 0 answers InProgressError at once.
func WithMaxWait(d time.Duration) ExecuteOption {
	return func(o *executeOptions) { o.maxWait = max(d, 0) }
}

// WithLocalFingerprint computes fingerprint v1 in the SDK and sends only the
// digest. Bodies over 1 MiB always use it. Only the request's IgnoreFields
// apply: list the endpoint policy's ignore_fields too if it has any.
func WithLocalFingerprint() ExecuteOption {
	return func(o *executeOptions) { o.localFingerprint = true }
}

// WithLease requests a lease of d (default: the endpoint policy's). The
// executor extends it every d/2 while the handler runs.
func WithLease(d time.Duration) ExecuteOption { return func(o *executeOptions) { o.lease = d } }

// WithTTL requests a dedup window of d (default: the endpoint policy's).
func WithTTL(d time.Duration) ExecuteOption { return func(o *executeOptions) { o.ttl = d } }

// WithTransportRetries sets how often each RPC is retried after a transport
// error (default DefaultTransportRetries). A Complete or Fail is retried at
// least that often and, beyond it, for as long as the claim's lease holds.
func WithTransportRetries(n int) ExecuteOption {
	return func(o *executeOptions) { o.transportRetries = max(n, 0) }
}

// ExecuteOnce runs handler at most once for (endpoint, key), across retries,
// processes and machines:
//
//   - first call: Claim succeeds, the handler runs, its response is stored
//     (Complete) and returned with Replayed false;
//   - a retry after completion gets the stored response, Replayed true;
//   - a duplicate while another execution runs waits up to the wait budget,
//     then fails with *InProgressError;
//   - the same key with a different request fails with *KeyReuseError;
//   - after an ambiguous failure, it fails with *OutcomePendingError;
//   - if the handler fails, its error is returned: marked with NoSideEffect
//     the key is released (a retry executes again), otherwise the outcome is
//     recorded as unknown with the error text as reason.
//
// Other errors are gRPC status errors (status.Code works on them) or
// *FingerprintError for a local fingerprint.
func (c *Client) ExecuteOnce(ctx context.Context, endpoint, key string, req HTTPRequest,
	handler Handler, opts ...ExecuteOption) (*Result, error) {
	o := executeOptions{maxWait: DefaultMaxWait, transportRetries: DefaultTransportRetries}
	for _, opt := range opts {
		opt(&o)
	}
	if handler == nil {
		return nil, errors.New("idemd: nil handler")
	}
	claim := &idemdv1.ClaimRequest{Endpoint: endpoint, Key: key, AttemptId: newAttemptID()}
	if o.localFingerprint || len(req.Body) > MaxServerBodyBytes {
		digest, err := Fingerprint(req)
		if err != nil {
			return nil, err
		}
		claim.Fingerprint = &idemdv1.ClaimRequest_Sha256{Sha256: digest[:]}
	} else {
		claim.Fingerprint = &idemdv1.ClaimRequest_Request{Request: req.proto()}
	}
	if o.lease > 0 {
		claim.Lease = durationpb.New(o.lease)
	}
	if o.ttl > 0 {
		claim.Ttl = durationpb.New(o.ttl)
	}

	claimed, replay, err := c.claimLoop(ctx, claim, &o)
	if err != nil {
		return nil, err
	}
	if replay != nil {
		return replay, nil
	}
	return c.runClaimed(ctx, claim, claimed, handler, &o)
}

// claimLoop claims until the key is ours, a stored response comes back, or a
// definitive answer (mismatch, pending, in progress past the budget).
func (c *Client) claimLoop(ctx context.Context, claim *idemdv1.ClaimRequest, o *executeOptions) (
	*idemdv1.Claimed, *Result, error) {
	deadline := time.Now().Add(o.maxWait)
	backoff := initialBackoff
	transportBackoff := initialBackoff
	failures := 0
	for {
		remaining := time.Until(deadline).Truncate(time.Millisecond)
		if remaining > 0 {
			claim.Wait = durationpb.New(remaining)
		} else {
			claim.Wait = nil
		}
		resp, err := c.callWithDeadline(ctx, max(remaining, 0), func(ctx context.Context) (*idemdv1.ClaimResponse, error) {
			return c.Claim(ctx, claim)
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil, fmt.Errorf("idemd: claim: %w", context.Cause(ctx))
			}
			if !isTransient(err) || failures >= o.transportRetries {
				return nil, nil, fmt.Errorf("idemd: claim: %w", err)
			}
			// The same attempt_id: a Claim whose answer was lost returns the
			// same lease instead of in_progress.
			failures++
			if err := sleep(ctx, fullJitter(transportBackoff)); err != nil {
				return nil, nil, fmt.Errorf("idemd: claim: %w", err)
			}
			transportBackoff = min(2*transportBackoff, maxBackoff)
			continue
		}
		switch out := resp.GetOutcome().(type) {
		case *idemdv1.ClaimResponse_Claimed:
			return out.Claimed, nil, nil
		case *idemdv1.ClaimResponse_Replayed:
			return nil, &Result{Response: ResponseFromProto(out.Replayed.GetResponse()), Replayed: true}, nil
		case *idemdv1.ClaimResponse_Mismatch:
			return nil, nil, &KeyReuseError{
				HTTPStatus: int(resp.GetHttpStatus()), ErrorCode: resp.GetErrorCode(), Fingerprint: resp.GetFingerprint(),
			}
		case *idemdv1.ClaimResponse_Pending:
			return nil, nil, &OutcomePendingError{
				HTTPStatus: int(resp.GetHttpStatus()), ErrorCode: resp.GetErrorCode(),
				State: out.Pending.GetState(), Reason: out.Pending.GetReason(),
			}
		case *idemdv1.ClaimResponse_InProgress:
			retryAfter := out.InProgress.GetRetryAfter().AsDuration()
			remaining := time.Until(deadline)
			if remaining <= 0 {
				return nil, nil, &InProgressError{
					HTTPStatus: int(resp.GetHttpStatus()), ErrorCode: resp.GetErrorCode(),
					RetryAfter: retryAfter, LeaseExpiresAt: out.InProgress.GetLeaseExpiresAt().AsTime(),
				}
			}
			pause := min(max(retryAfter, fullJitter(backoff)), remaining)
			backoff = min(2*backoff, maxBackoff)
			if err := sleep(ctx, pause); err != nil {
				return nil, nil, fmt.Errorf("idemd: claim: %w", err)
			}
		default:
			return nil, nil, errors.New("idemd: claim: the server answered no outcome")
		}
	}
}

// runClaimed runs the handler under a held claim and records its outcome.
func (c *Client) runClaimed(ctx context.Context, claim *idemdv1.ClaimRequest, claimed *idemdv1.Claimed,
	handler Handler, o *executeOptions) (*Result, error) {
	lease := o.lease
	if lease <= 0 {
		lease = time.Until(claimed.GetLeaseExpiresAt().AsTime())
	}
	handlerCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	held := new(leaseEnd)
	held.set(time.Now().Add(lease))
	stopKeeper := c.keepLease(handlerCtx, cancel, claim, claimed.GetLeaseToken(), lease, held, o)

	ex := Execution{Endpoint: claim.GetEndpoint(), Key: claim.GetKey(), Attempt: claimed.GetAttempt()}
	resp, panicked, panicValue, handlerErr := callHandler(handlerCtx, handler, ex)
	stopKeeper()

	// Record the outcome even if the caller's context is cancelled now: the
	// side effect happened or not regardless.
	recordCtx := context.WithoutCancel(ctx)
	token := claimed.GetLeaseToken()

	if panicked {
		_ = c.fail(recordCtx, held, claim, token, idemdv1.Disposition_DISPOSITION_UNKNOWN, panicReason(panicValue), o)
		panic(panicValue)
	}
	if handlerErr != nil {
		disposition := idemdv1.Disposition_DISPOSITION_UNKNOWN
		if IsNoSideEffect(handlerErr) {
			disposition = idemdv1.Disposition_DISPOSITION_RELEASE
		}
		if err := c.fail(recordCtx, held, claim, token, disposition, handlerErr.Error(), o); err != nil {
			return nil, errors.Join(handlerErr, fmt.Errorf("idemd: recording the failure: %w", err))
		}
		return nil, handlerErr
	}
	if resp == nil {
		reason := "handler returned neither a response nor an error"
		_ = c.fail(recordCtx, held, claim, token, idemdv1.Disposition_DISPOSITION_UNKNOWN, reason, o)
		return nil, errors.New("idemd: " + reason)
	}

	err := c.retryRecord(recordCtx, o, held, func(ctx context.Context) error {
		_, err := c.Complete(ctx, &idemdv1.CompleteRequest{
			Endpoint: claim.GetEndpoint(), Key: claim.GetKey(), LeaseToken: token, Response: resp.proto(),
		})
		return err
	})
	if err != nil {
		switch status.Code(err) {
		case codes.FailedPrecondition, codes.NotFound:
			// Fenced out or already decided: nothing left to record.
		default:
			// Refused (e.g. too large) or unreachable: the side effect happened,
			// so make the record pending now rather than at lease expiry.
			_ = c.fail(recordCtx, held, claim, token, idemdv1.Disposition_DISPOSITION_UNKNOWN,
				"the handler's response could not be stored: "+status.Code(err).String(), o)
		}
		return nil, &CompleteError{Response: resp, Err: err}
	}
	return &Result{Response: resp, Attempt: claimed.GetAttempt()}, nil
}

// panicReason is the stored Fail reason of a handler's panic: "panic:
// <value>", the "<Kind>: <message>" every SDK stores for a handler that
// raises (clients/conformance/http-scenarios.md), Go's kind being the panic
// itself; fail caps it at the server's 1,024 bytes on a rune boundary.
func panicReason(value any) string { return fmt.Sprintf("panic: %v", value) }

// callHandler runs the handler, catching a panic so that the outcome can be
// recorded as unknown before the panic continues.
func callHandler(ctx context.Context, handler Handler, ex Execution) (resp *Response, panicked bool, value any, err error) {
	defer func() {
		if r := recover(); r != nil {
			resp, panicked, value, err = nil, true, r, nil
		}
	}()
	resp, err = handler(ctx, ex)
	return resp, false, nil, err
}

func (c *Client) fail(ctx context.Context, held *leaseEnd, claim *idemdv1.ClaimRequest, token string,
	disposition idemdv1.Disposition, reason string, o *executeOptions) error {
	return c.retryRecord(ctx, o, held, func(ctx context.Context) error {
		_, err := c.Fail(ctx, &idemdv1.FailRequest{
			Endpoint: claim.GetEndpoint(), Key: claim.GetKey(), LeaseToken: token,
			Disposition: disposition, Reason: truncateUTF8(reason, maxReasonBytes),
		})
		return err
	})
}

// keepLease extends the lease at half its length while the handler runs. If
// the lease is lost, it cancels the handler's context with ErrLeaseLost. The
// returned function stops it and waits for an extension under way. Without
// WithLease, the lease is what the server granted (lease_expires_at - now).
//
// The first extension is a timer, not a goroutine waiting on one: most
// handlers return long before half a lease, and then stop only cancels the
// timer. A goroutine per call cost every request its start and, in stop, a
// handoff to it and back (a scheduler wake-up on the request's path).
func (c *Client) keepLease(ctx context.Context, cancel context.CancelCauseFunc, claim *idemdv1.ClaimRequest,
	token string, lease time.Duration, held *leaseEnd, o *executeOptions) (stop func()) {
	if lease <= 2*minLeaseTick {
		return func() {}
	}
	interval := lease / 2
	done := make(chan struct{})
	finished := make(chan struct{})
	first := time.AfterFunc(interval, func() {
		defer close(finished)
		var next *time.Timer
		for {
			// Extend until the handler returns, even if the caller gave up:
			// a handler that ignores cancellation still holds the key.
			select {
			case <-done:
				return
			default:
			}
			sent := time.Now()
			callCtx, cancelCall := context.WithTimeout(context.WithoutCancel(ctx), interval)
			_, err := c.ExtendLease(callCtx, &idemdv1.ExtendLeaseRequest{
				Endpoint: claim.GetEndpoint(), Key: claim.GetKey(), LeaseToken: token,
				Lease: durationpb.New(lease),
			})
			cancelCall()
			pause := interval
			switch code := status.Code(err); {
			case err == nil:
				held.set(sent.Add(lease))
			case code == codes.FailedPrecondition || code == codes.NotFound:
				cancel(ErrLeaseLost)
				return
			default:
				// Transient: try again sooner, while the lease still holds.
				pause = max(interval/4, minLeaseTick)
			}
			if next == nil {
				next = time.NewTimer(pause)
				defer next.Stop()
			} else {
				next.Reset(pause)
			}
			select {
			case <-done:
				return
			case <-next.C:
			}
		}
	})
	return func() {
		close(done)
		if !first.Stop() {
			<-finished // it fired: wait for the extension loop to see done
		}
	}
}

// callWithDeadline gives a Claim that may wait server-side wait plus the
// default call timeout.
func (c *Client) callWithDeadline(ctx context.Context, wait time.Duration,
	call func(context.Context) (*idemdv1.ClaimResponse, error)) (*idemdv1.ClaimResponse, error) {
	if c.callTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, wait+c.callTimeout)
		defer cancel()
	}
	return call(ctx)
}

// leaseEnd is when the claim's lease ends as far as this process knows: the
// claim's lease from when it was granted, moved on by every extension (local
// clock; a lower bound, as each is counted from when its request was sent).
type leaseEnd struct{ nanos atomic.Int64 }

func (l *leaseEnd) set(t time.Time) { l.nanos.Store(t.UnixNano()) }
func (l *leaseEnd) get() time.Time  { return time.Unix(0, l.nanos.Load()) }

// retryRecord delivers a Complete or Fail: a transport error is retried with
// backoff (grpc-go reconnects in between) for as long as the lease holds, at
// least o.transportRetries times. Reporting the call as failed earlier would
// leave the key IN_PROGRESS until the lease expires, and then UNKNOWN, for a
// handler that ran and a record that one more attempt would have stored.
func (c *Client) retryRecord(ctx context.Context, o *executeOptions, held *leaseEnd, call func(context.Context) error) error {
	backoff := initialBackoff
	for failures := 0; ; failures++ {
		err := call(ctx)
		if err == nil || !isTransient(err) || ctx.Err() != nil {
			return err
		}
		pause := fullJitter(backoff)
		if failures >= o.transportRetries && !time.Now().Add(pause).Before(held.get()) {
			return err
		}
		if err := sleep(ctx, pause); err != nil {
			return err
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// isTransient: errors after which the same call may succeed. INVALID_ARGUMENT,
// UNAUTHENTICATED, PERMISSION_DENIED, RESOURCE_EXHAUSTED are never retried.
func isTransient(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted:
		return true
	}
	return false
}

func fullJitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(mathrand.Int64N(int64(d) + 1))
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// newAttemptID identifies one ExecuteOnce call across transport retries of
// its Claim: 128 random bits, base64url.
func newAttemptID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics instead)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
