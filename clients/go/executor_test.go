package idemd_test

// Executor behaviour beyond the shared scenarios, against a live idemd.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	idemd "github.com/idemd/idemd/clients/go"
	idemdv1 "github.com/idemd/idemd/clients/go/gen/idemd/v1"
	"github.com/idemd/idemd/clients/go/internal/testserver"
)

const paymentsEndpoint = "POST /v1/payments"

var payment = idemd.HTTPRequest{Method: "POST", Path: "/v1/payments", ContentType: "application/json",
	Body: []byte(`{"amount":4200,"currency":"usd","customer":"cus_8812"}`)}

func credential(t *testing.T, name string) string {
	t.Helper()
	token, err := testserver.Credential(name)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

func newClient(t *testing.T, opts ...idemd.Option) *idemd.Client {
	t.Helper()
	srv := testserver.Shared(t)
	opts = append([]idemd.Option{idemd.WithToken(credential(t, "alice")), idemd.WithInsecure()}, opts...)
	c, err := idemd.New(srv.Addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func newKey(t *testing.T) string { return "go-" + randomPrefix(t) }

func created(body string) *idemd.Response {
	return &idemd.Response{Status: 201, Headers: []idemd.Header{{Name: "Content-Type", Value: "application/json"}},
		Body: []byte(body)}
}

func lookupState(t *testing.T, c *idemd.Client, endpoint, key string) string {
	t.Helper()
	resp, err := c.Lookup(context.Background(), &idemdv1.LookupRequest{Endpoint: endpoint, Key: key})
	if status.Code(err) == codes.NotFound {
		return "NOT_FOUND"
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(resp.GetRecord().GetState().String(), "STATE_")
}

// A handler that outlives its lease keeps the key: the executor extends the
// lease at half its length, so a duplicate on an endpoint whose policy takes
// over expired leases still sees in_progress.
func TestLeaseIsExtendedWhileTheHandlerRuns(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	key := newKey(t)
	const endpoint = "POST /v1/takeover"
	var duplicate string
	res, err := c.ExecuteOnce(context.Background(), endpoint, key, payment, func(ctx context.Context, _ idemd.Execution) (*idemd.Response, error) {
		time.Sleep(1200 * time.Millisecond) // more than two leases
		resp, err := c.Claim(ctx, &idemdv1.ClaimRequest{Endpoint: endpoint, Key: key,
			Fingerprint: &idemdv1.ClaimRequest_Request{Request: &idemdv1.HttpRequest{
				Method: payment.Method, Path: payment.Path, ContentType: payment.ContentType, Body: payment.Body}}})
		if err != nil {
			return nil, err
		}
		duplicate = outcomeName(resp)
		time.Sleep(300 * time.Millisecond)
		return created(`{"id":"pay_long"}`), nil
	}, idemd.WithLease(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if duplicate != "in_progress" {
		t.Errorf("a duplicate claim during the handler got %s, want in_progress (lease not extended)", duplicate)
	}
	if res.Replayed || res.Attempt != 1 || string(res.Response.Body) != `{"id":"pay_long"}` {
		t.Errorf("result = %+v", res)
	}
}

// extendLeaseCounter counts the client's ExtendLease calls and answers the
// ones from number failFrom on with FAILED_PRECONDITION (the lease was lost),
// without sending them (failFrom 0: never).
func extendLeaseCounter(calls *atomic.Int32, failFrom int32) idemd.Option {
	return idemd.WithDialOptions(grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
		cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if strings.HasSuffix(method, "/ExtendLease") {
			if n := calls.Add(1); failFrom > 0 && n >= failFrom {
				return status.Error(codes.FailedPrecondition, "lease lost (test)")
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}))
}

// The lease keeper goes on extending after the first extension, and a lost
// lease cancels the handler's context with ErrLeaseLost.
func TestLostLeaseCancelsTheHandler(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	c := newClient(t, extendLeaseCounter(&calls, 2))
	var cause error
	_, _ = c.ExecuteOnce(context.Background(), paymentsEndpoint, newKey(t), payment, func(ctx context.Context, _ idemd.Execution) (*idemd.Response, error) {
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
		case <-time.After(5 * time.Second):
		}
		return nil, idemd.NoSideEffect(errors.New("stopped"))
	}, idemd.WithLease(200*time.Millisecond))
	if !errors.Is(cause, idemd.ErrLeaseLost) || calls.Load() != 2 {
		t.Errorf("handler context ended with %v after %d ExtendLease calls; want ErrLeaseLost after 2", cause, calls.Load())
	}
}

// A handler that returns within half its lease costs no ExtendLease, and none
// comes after it returned.
func TestNoLeaseExtensionAfterAQuickHandler(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	c := newClient(t, extendLeaseCounter(&calls, 0))
	_, err := c.ExecuteOnce(context.Background(), paymentsEndpoint, newKey(t), payment, func(context.Context, idemd.Execution) (*idemd.Response, error) {
		return created(`{"id":"pay_quick"}`), nil
	}, idemd.WithLease(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // past the first extension's time
	if n := calls.Load(); n != 0 {
		t.Errorf("%d ExtendLease calls for a handler that returned at once", n)
	}
}

// A Claim whose response is lost is retried with the same attempt_id, and the
// server answers the same claim: the handler still runs exactly once.
func TestLostClaimResponseIsRetriedWithTheSameAttemptID(t *testing.T) {
	t.Parallel()
	var (
		mu         sync.Mutex
		attemptIDs []string
	)
	dropFirstClaim := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if claim, ok := req.(*idemdv1.ClaimRequest); ok {
			mu.Lock()
			defer mu.Unlock()
			attemptIDs = append(attemptIDs, claim.GetAttemptId())
			if len(attemptIDs) == 1 && err == nil {
				return status.Error(codes.Unavailable, "injected: connection reset before the response arrived")
			}
		}
		return err
	}
	c := newClient(t, idemd.WithDialOptions(grpc.WithChainUnaryInterceptor(dropFirstClaim)))
	var calls atomic.Int32
	res, err := c.ExecuteOnce(context.Background(), paymentsEndpoint, newKey(t), payment,
		func(context.Context, idemd.Execution) (*idemd.Response, error) {
			calls.Add(1)
			return created(`{"id":"pay_retry"}`), nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if res.Replayed || res.Attempt != 1 || calls.Load() != 1 {
		t.Errorf("result = %+v after %d handler calls; want executed once", res, calls.Load())
	}
	if len(attemptIDs) != 2 || attemptIDs[0] != attemptIDs[1] || len(attemptIDs[0]) < 16 {
		t.Errorf("claim attempt ids = %q; want the same id twice", attemptIDs)
	}
}

// INVALID_ARGUMENT (and the other definitive codes) are never retried.
func TestDefinitiveClaimErrorsAreNotRetried(t *testing.T) {
	t.Parallel()
	var claims atomic.Int32
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if strings.HasSuffix(method, "/Claim") {
			claims.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c := newClient(t, idemd.WithDialOptions(grpc.WithChainUnaryInterceptor(count)))
	_, err := c.ExecuteOnce(context.Background(), paymentsEndpoint, "not a valid key!", payment,
		func(context.Context, idemd.Execution) (*idemd.Response, error) {
			t.Error("handler ran")
			return nil, nil
		})
	if status.Code(err) != codes.InvalidArgument || claims.Load() != 1 {
		t.Errorf("err = %v after %d claims; want INVALID_ARGUMENT after 1", err, claims.Load())
	}
}

// The wait budget bounds how long a duplicate waits; the in-progress error
// carries 409 request_in_progress and a retry hint.
func TestInProgressErrorAfterTheWaitBudget(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	key := newKey(t)
	held, err := c.Claim(context.Background(), &idemdv1.ClaimRequest{Endpoint: paymentsEndpoint, Key: key,
		Fingerprint: &idemdv1.ClaimRequest_Request{Request: &idemdv1.HttpRequest{
			Method: payment.Method, Path: payment.Path, ContentType: payment.ContentType, Body: payment.Body}},
		Lease: durationpb.New(5 * time.Second)})
	if err != nil || held.GetClaimed() == nil {
		t.Fatalf("claim: %v %v", held, err)
	}
	never := func(context.Context, idemd.Execution) (*idemd.Response, error) {
		t.Error("handler ran")
		return nil, nil
	}
	for _, budget := range []time.Duration{0, 300 * time.Millisecond} {
		start := time.Now()
		_, err := c.ExecuteOnce(context.Background(), paymentsEndpoint, key, payment, never, idemd.WithMaxWait(budget))
		elapsed := time.Since(start)
		var progress *idemd.InProgressError
		if !errors.As(err, &progress) {
			t.Fatalf("budget %s: err = %v, want *InProgressError", budget, err)
		}
		if progress.HTTPStatus != 409 || progress.ErrorCode != "request_in_progress" || progress.RetryAfter <= 0 {
			t.Errorf("budget %s: %+v", budget, progress)
		}
		if elapsed < budget || elapsed > budget+time.Second {
			t.Errorf("budget %s: gave up after %s", budget, elapsed)
		}
	}
}

// A panicking handler leaves the outcome UNKNOWN, and the panic goes on.
func TestPanickingHandlerLeavesTheOutcomeUnknown(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	key := newKey(t)
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v, want the handler's panic", r)
			}
		}()
		_, _ = c.ExecuteOnce(context.Background(), paymentsEndpoint, key, payment,
			func(context.Context, idemd.Execution) (*idemd.Response, error) { panic("boom") })
		t.Error("ExecuteOnce returned after a panic")
	}()
	if got := lookupState(t, c, paymentsEndpoint, key); got != "UNKNOWN" {
		t.Errorf("state = %s, want UNKNOWN", got)
	}
	_, err := c.ExecuteOnce(context.Background(), paymentsEndpoint, key, payment,
		func(context.Context, idemd.Execution) (*idemd.Response, error) {
			t.Error("handler ran")
			return nil, nil
		})
	var pending *idemd.OutcomePendingError
	if !errors.As(err, &pending) || pending.HTTPStatus != 409 || pending.ErrorCode != "outcome_pending" ||
		pending.State != idemdv1.State_STATE_UNKNOWN || pending.Reason != "panic: boom" {
		t.Errorf("err = %v, want outcome_pending UNKNOWN with reason %q", err, "panic: boom")
	}
}

// A panic's reason is capped at the server's 1,024 bytes on a rune
// boundary: cut inside a rune it would not be UTF-8, and the Fail carrying
// it would be refused, leaving the key claimed until its lease ran out.
func TestPanicReasonIsCappedOnARuneBoundary(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	key := newKey(t)
	func() {
		defer func() { _ = recover() }()
		_, _ = c.ExecuteOnce(context.Background(), paymentsEndpoint, key, payment,
			func(context.Context, idemd.Execution) (*idemd.Response, error) { panic(strings.Repeat("é", 600)) })
	}()
	resp, err := c.Lookup(context.Background(), &idemdv1.LookupRequest{Endpoint: paymentsEndpoint, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	// "panic: " is 7 bytes, each é 2: 508 of them end at byte 1,023.
	if want := "panic: " + strings.Repeat("é", 508); resp.GetRecord().GetReason() != want {
		t.Errorf("reason of %d bytes, want %d: %.40q...", len(resp.GetRecord().GetReason()), len(want), resp.GetRecord().GetReason())
	}
}

// An ambiguous handler error is recorded with its text as the reason.
func TestAmbiguousFailureReasonIsTheErrorText(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	key := newKey(t)
	handlerErr := errors.New("provider timed out after 30s")
	_, err := c.ExecuteOnce(context.Background(), paymentsEndpoint, key, payment,
		func(context.Context, idemd.Execution) (*idemd.Response, error) { return nil, handlerErr })
	if !errors.Is(err, handlerErr) {
		t.Fatalf("err = %v, want the handler's error", err)
	}
	resp, err := c.Lookup(context.Background(), &idemdv1.LookupRequest{Endpoint: paymentsEndpoint, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.GetRecord(); r.GetState() != idemdv1.State_STATE_UNKNOWN || r.GetReason() != handlerErr.Error() {
		t.Errorf("record = %v", r)
	}
}

// A response the server refuses to store is reported with the response, and
// the record is made pending at once (the side effect did happen).
func TestUnstorableResponse(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	key := newKey(t)
	huge := created(strings.Repeat("x", 300*1024)) // over max_response_bytes (256 KiB)
	_, err := c.ExecuteOnce(context.Background(), paymentsEndpoint, key, payment,
		func(context.Context, idemd.Execution) (*idemd.Response, error) { return huge, nil })
	var ce *idemd.CompleteError
	if !errors.As(err, &ce) || ce.Response != huge || status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("err = %v, want *CompleteError with RESOURCE_EXHAUSTED", err)
	}
	if got := lookupState(t, c, paymentsEndpoint, key); got != "UNKNOWN" {
		t.Errorf("state = %s, want UNKNOWN", got)
	}
}

// Bodies over 1 MiB are fingerprinted locally (the server refuses them).
func TestLargeBodiesUseTheLocalFingerprint(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	key := newKey(t)
	big := payment
	big.Body = []byte(`{"blob":"` + strings.Repeat("a", 1536*1024) + `","amount":1}`)
	var calls atomic.Int32
	handler := func(context.Context, idemd.Execution) (*idemd.Response, error) {
		calls.Add(1)
		return created(`{"id":"pay_big"}`), nil
	}
	first, err := c.ExecuteOnce(context.Background(), paymentsEndpoint, key, big, handler)
	if err != nil || first.Replayed {
		t.Fatalf("first: %+v, %v", first, err)
	}
	reordered := big
	reordered.Body = []byte(`{"amount":1.0,"blob":"` + strings.Repeat("a", 1536*1024) + `"}`)
	second, err := c.ExecuteOnce(context.Background(), paymentsEndpoint, key, reordered, handler)
	if err != nil || !second.Replayed || calls.Load() != 1 {
		t.Fatalf("second: %+v, %v, %d calls", second, err, calls.Load())
	}
}

// A body the local fingerprint refuses fails before any claim.
func TestLocalFingerprintErrorsFailBeforeClaiming(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	key := newKey(t)
	bad := payment
	bad.Body = []byte(`{"amount":1,"amount":2}`)
	_, err := c.ExecuteOnce(context.Background(), paymentsEndpoint, key, bad,
		func(context.Context, idemd.Execution) (*idemd.Response, error) {
			t.Error("handler ran")
			return nil, nil
		},
		idemd.WithLocalFingerprint())
	if !errors.Is(err, idemd.ErrDuplicateKey) {
		t.Errorf("err = %v, want duplicate_key", err)
	}
	if got := lookupState(t, c, paymentsEndpoint, key); got != "NOT_FOUND" {
		t.Errorf("state = %s, want NOT_FOUND", got)
	}
}

// The caller's cancellation reaches the handler, and the outcome is still
// recorded (UNKNOWN: the handler did not say nothing happened).
func TestCancelledCallerStillRecordsTheOutcome(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	key := newKey(t)
	ctx, cancel := context.WithCancel(context.Background())
	_, err := c.ExecuteOnce(ctx, paymentsEndpoint, key, payment, func(ctx context.Context, _ idemd.Execution) (*idemd.Response, error) {
		cancel()
		<-ctx.Done()
		return nil, ctx.Err()
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if got := lookupState(t, c, paymentsEndpoint, key); got != "UNKNOWN" {
		t.Errorf("state = %s, want UNKNOWN", got)
	}
}

// Development servers without auth take the tenant from x-tenant-id.
func TestTenantHeader(t *testing.T) {
	t.Parallel()
	srv, err := testserver.StartWithoutAuth()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Error(err)
		}
	})
	tenant := func(name string) *idemd.Client {
		c, err := idemd.New(srv.Addr, idemd.WithTenant(name), idemd.WithInsecure())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	acme, globex := tenant("acme"), tenant("globex")
	key := newKey(t)
	if _, err := acme.ExecuteOnce(context.Background(), paymentsEndpoint, key, payment,
		func(context.Context, idemd.Execution) (*idemd.Response, error) { return created(`{}`), nil }); err != nil {
		t.Fatal(err)
	}
	if got := lookupState(t, acme, paymentsEndpoint, key); got != "COMPLETED" {
		t.Errorf("acme sees %s, want COMPLETED", got)
	}
	if got := lookupState(t, globex, paymentsEndpoint, key); got != "NOT_FOUND" {
		t.Errorf("globex sees %s, want NOT_FOUND", got)
	}
}
