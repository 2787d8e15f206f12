package payments_test

// Drives the example over real HTTP against a live idemd.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	idemd "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/clients/go/examples/payments"
	"github.com/idemd/idemd/clients/go/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

const paymentBody = `{"amount":4200,"currency":"usd","customer":"cus_8812"}`

func newAPI(t *testing.T, provider payments.Provider, maxWait ...time.Duration) *httptest.Server {
	t.Helper()
	srv := testserver.Shared(t)
	var file struct {
		Credentials map[string]string `json:"credentials"`
	}
	data, err := os.ReadFile(filepath.Join(testserver.ConformanceDir(), "scenarios.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	client, err := idemd.New(srv.Addr, idemd.WithToken(file.Credentials["alice"]), idemd.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server := &payments.Server{Idemd: client, Provider: provider}
	if len(maxWait) > 0 {
		server.MaxWait = maxWait[0]
	}
	handler, err := server.Handler()
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(handler)
	t.Cleanup(api.Close)
	return api
}

func newKey(t *testing.T) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "http-" + hex.EncodeToString(b[:])
}

type reply struct {
	status int
	header http.Header
	body   string
}

// post sends POST /v1/payments; headerName lets a test spell the header name
// as it likes (the map is used as is, without canonicalization).
func post(t *testing.T, api *httptest.Server, headerName, key, body string) reply {
	t.Helper()
	r, err := tryPost(api, headerName, key, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func tryPost(api *httptest.Server, headerName, key, body string) (reply, error) {
	req, err := http.NewRequest(http.MethodPost, api.URL+"/v1/payments", strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if headerName != "" {
		req.Header[headerName] = []string{key}
	}
	resp, err := api.Client().Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(data)}, err
}

func errorCode(t *testing.T, r reply) string {
	t.Helper()
	// The app's own errors are {"error": code}; the middleware's are
	// problem details whose type ends in the code.
	var body struct {
		Error string `json:"error"`
		Type  string `json:"type"`
	}
	if err := json.Unmarshal([]byte(r.body), &body); err != nil {
		t.Fatalf("error body %q: %v", r.body, err)
	}
	if body.Type != "" {
		return body.Type[strings.LastIndex(body.Type, "/")+1:]
	}
	return body.Error
}

func TestPaymentsOverHTTP(t *testing.T) {
	t.Parallel()
	provider := &payments.FakeProvider{}
	api := newAPI(t, provider)
	key := newKey(t)

	if r := post(t, api, "", "", paymentBody); r.status != 400 || errorCode(t, r) != "idempotency_key_missing" {
		t.Errorf("missing key: %d %s", r.status, r.body)
	}
	if r := post(t, api, "Idempotency-Key", "not a valid key!", paymentBody); r.status != 400 || errorCode(t, r) != "idempotency_key_malformed" {
		t.Errorf("malformed key: %d %s", r.status, r.body)
	}
	if r := post(t, api, "Idempotency-Key", strings.Repeat("k", 256), paymentBody); r.status != 400 || errorCode(t, r) != "idempotency_key_malformed" {
		t.Errorf("key too long: %d %s", r.status, r.body)
	}

	first := post(t, api, "Idempotency-Key", key, paymentBody)
	if first.status != 201 || first.header.Get("Idempotent-Replayed") != "" ||
		first.header.Get("Content-Type") != "application/json" || !strings.Contains(first.body, `"id":"pay_`) {
		t.Fatalf("first POST: %d %v %s", first.status, first.header, first.body)
	}

	// The retry spells the header in lower case and orders the JSON members
	// differently: the same request, so the stored response comes back.
	retry := post(t, api, "idempotency-key", key, `{"customer":"cus_8812","currency":"usd","amount":4200}`)
	if retry.status != 201 || retry.body != first.body || retry.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry: %d %v %s; want the first response replayed", retry.status, retry.header, retry.body)
	}
	if provider.Charges() != 1 {
		t.Errorf("%d charges, want 1", provider.Charges())
	}

	changed := post(t, api, "Idempotency-Key", key, `{"amount":42000,"currency":"usd","customer":"cus_8812"}`)
	if changed.status != 422 || errorCode(t, changed) != "idempotency_key_reuse" {
		t.Errorf("changed body: %d %s", changed.status, changed.body)
	}
	if provider.Charges() != 1 {
		t.Errorf("%d charges after the changed body, want 1", provider.Charges())
	}
}

// gatedProvider blocks its first charge until released.
type gatedProvider struct {
	payments.FakeProvider
	entered, release chan struct{}
	once             atomic.Bool
}

func (g *gatedProvider) Charge(ctx context.Context, key string, p payments.Payment) (payments.Charge, error) {
	if g.once.CompareAndSwap(false, true) {
		close(g.entered)
		<-g.release
	}
	return g.FakeProvider.Charge(ctx, key, p)
}

func TestInProgressIs409WithRetryAfter(t *testing.T) {
	t.Parallel()
	provider := &gatedProvider{entered: make(chan struct{}), release: make(chan struct{})}
	api := newAPI(t, provider, 200*time.Millisecond)
	key := newKey(t)

	done := make(chan reply, 1)
	go func() {
		r, err := tryPost(api, "Idempotency-Key", key, paymentBody)
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	<-provider.entered
	dup := post(t, api, "Idempotency-Key", key, paymentBody)
	if dup.status != 409 || errorCode(t, dup) != "request_in_progress" {
		t.Errorf("duplicate in flight: %d %s", dup.status, dup.body)
	}
	if s, err := strconv.Atoi(dup.header.Get("Retry-After")); err != nil || s < 1 {
		t.Errorf("Retry-After = %q, want whole seconds >= 1", dup.header.Get("Retry-After"))
	}
	close(provider.release)
	if first := <-done; first.status != 201 {
		t.Errorf("first: %d %s", first.status, first.body)
	}
	if again := post(t, api, "Idempotency-Key", key, paymentBody); again.status != 201 || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("after completion: %d %v", again.status, again.header)
	}
}

type flakyProvider struct{ err error }

func (f flakyProvider) Charge(context.Context, string, payments.Payment) (payments.Charge, error) {
	return payments.Charge{}, f.err
}

func TestProviderFailures(t *testing.T) {
	t.Parallel()
	// A timeout: the charge may have happened, so retries get 409 outcome_pending.
	timeout := newAPI(t, flakyProvider{errors.New("provider: read timeout")})
	key := newKey(t)
	if r := post(t, timeout, "Idempotency-Key", key, paymentBody); r.status != 502 || errorCode(t, r) != "payment_outcome_unknown" {
		t.Errorf("timeout: %d %s", r.status, r.body)
	}
	if r := post(t, timeout, "Idempotency-Key", key, paymentBody); r.status != 409 || errorCode(t, r) != "outcome_pending" {
		t.Errorf("retry after a timeout: %d %s", r.status, r.body)
	}

	// Rejected before processing: the key is released and a retry executes.
	rejected := newAPI(t, flakyProvider{payments.ErrRejected})
	key = newKey(t)
	if r := post(t, rejected, "Idempotency-Key", key, paymentBody); r.status != 502 || errorCode(t, r) != "payment_rejected" {
		t.Errorf("rejected: %d %s", r.status, r.body)
	}
	working := newAPI(t, &payments.FakeProvider{})
	if r := post(t, working, "Idempotency-Key", key, paymentBody); r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("retry after a rejection: %d %v %s", r.status, r.header, r.body)
	}

	// A declined card is a stored outcome, replayed on retry.
	declined := newAPI(t, flakyProvider{payments.ErrDeclined})
	key = newKey(t)
	first := post(t, declined, "Idempotency-Key", key, paymentBody)
	again := post(t, declined, "Idempotency-Key", key, paymentBody)
	if first.status != 402 || again.status != 402 || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("declined: %d then %d %v", first.status, again.status, again.header)
	}
}
