// Package payments is an example HTTP front end that makes POST /v1/payments
// safe to retry with idemd, using only net/http.
//
//   - Idempotency-Key header (case-insensitive): missing → 400
//     {"error":"idempotency_key_missing"}, malformed → 400
//     {"error":"idempotency_key_invalid"};
//   - the charge runs through ExecuteOnce: at most once per key;
//   - a retry gets the stored response with "Idempotent-Replayed: true";
//   - in progress → 409 request_in_progress with Retry-After; undecided
//     outcome → 409 outcome_pending; same key, different body → 422
//     idempotency_key_reuse.
package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	idemd "github.com/idemd/idemd/clients/go"
)

// Endpoint is the idemd endpoint (policy name) of the payments route.
const Endpoint = "POST /v1/payments"

// maxBody is the largest request body accepted.
const maxBody = 1 << 20

var validKey = regexp.MustCompile(`^[A-Za-z0-9_-]{1,255}$`)

// Payment is the request body of POST /v1/payments.
type Payment struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Customer string `json:"customer"`
}

// Charge is what the payment provider answers.
type Charge struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

// ErrDeclined: the provider declined the card. A definitive business outcome,
// stored and replayed like a success (402).
var ErrDeclined = errors.New("card declined")

// ErrRejected: the provider refused the request before processing it (bad
// request, rate limited). Nothing happened: the key is released.
var ErrRejected = errors.New("rejected by the provider before processing")

// Provider moves money. idempotencyKey is the provider's own idempotency key;
// the same key must never charge twice.
type Provider interface {
	Charge(ctx context.Context, idempotencyKey string, p Payment) (Charge, error)
}

// Server serves POST /v1/payments.
type Server struct {
	Idemd    *idemd.Client
	Provider Provider
	// Options for every ExecuteOnce (e.g. idemd.WithMaxWait).
	Options []idemd.ExecuteOption
}

// Handler returns the routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/payments", s.createPayment)
	return mux
}

func (s *Server) createPayment(w http.ResponseWriter, r *http.Request) {
	keys := r.Header.Values("Idempotency-Key") // header names are case-insensitive
	switch {
	case len(keys) == 0:
		writeError(w, http.StatusBadRequest, "idempotency_key_missing")
		return
	case len(keys) > 1 || !validKey.MatchString(keys[0]):
		writeError(w, http.StatusBadRequest, "idempotency_key_invalid")
		return
	}
	key := keys[0]

	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "request_too_large")
		return
	}
	var payment Payment
	if err := json.Unmarshal(body, &payment); err != nil || payment.Amount <= 0 || payment.Currency == "" {
		writeError(w, http.StatusBadRequest, "invalid_payment")
		return
	}

	request := idemd.HTTPRequest{
		Method: r.Method, Path: r.URL.Path, ContentType: r.Header.Get("Content-Type"), Body: body,
	}
	var providerErr error
	result, err := s.Idemd.ExecuteOnce(r.Context(), Endpoint, key, request, func(ctx context.Context, ex idemd.Execution) (*idemd.Response, error) {
		// The provider's key is derived from ours: every retry of this
		// payment sends the same one, so the provider never charges twice.
		charge, err := s.Provider.Charge(ctx, ex.DownstreamKey("charge"), payment)
		switch {
		case errors.Is(err, ErrDeclined):
			return jsonResponse(http.StatusPaymentRequired, map[string]string{"error": "card_declined"}), nil
		case errors.Is(err, ErrRejected):
			providerErr = err
			return nil, idemd.NoSideEffect(err) // nothing happened: release the key
		case err != nil:
			providerErr = err
			return nil, err // outcome unknown (timeout, connection reset): never release
		}
		return jsonResponse(http.StatusCreated, map[string]any{
			"id": charge.ID, "amount": payment.Amount, "currency": payment.Currency, "status": charge.Status,
		}), nil
	}, s.Options...)
	switch {
	case err != nil && providerErr != nil && errors.Is(err, ErrRejected):
		writeError(w, http.StatusBadGateway, "payment_rejected") // safe to retry
		return
	case err != nil && providerErr != nil:
		writeError(w, http.StatusBadGateway, "payment_outcome_unknown") // retries get 409 outcome_pending
		return
	case err != nil:
		writeExecuteError(w, err)
		return
	}
	for _, h := range result.Response.Headers {
		w.Header().Add(h.Name, h.Value)
	}
	if result.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(result.Response.Status)
	_, _ = w.Write(result.Response.Body)
}

func writeExecuteError(w http.ResponseWriter, err error) {
	var (
		reuse    *idemd.KeyReuseError
		pending  *idemd.OutcomePendingError
		progress *idemd.InProgressError
	)
	switch {
	case errors.As(err, &reuse):
		writeError(w, reuse.HTTPStatus, reuse.ErrorCode) // 422 idempotency_key_reuse
	case errors.As(err, &progress):
		seconds := max(1, int(math.Ceil(progress.RetryAfter.Seconds())))
		w.Header().Set("Retry-After", strconv.Itoa(seconds))
		writeError(w, progress.HTTPStatus, progress.ErrorCode) // 409 request_in_progress
	case errors.As(err, &pending):
		writeError(w, pending.HTTPStatus, pending.ErrorCode) // 409 outcome_pending
	case status.Code(err) == codes.InvalidArgument:
		writeError(w, http.StatusBadRequest, "invalid_request")
	default:
		var complete *idemd.CompleteError
		if errors.As(err, &complete) {
			// Charged, but the response could not be stored.
			writeError(w, http.StatusBadGateway, "payment_outcome_unknown")
			return
		}
		writeError(w, http.StatusServiceUnavailable, "idempotency_service_unavailable")
	}
}

func jsonResponse(statusCode int, v any) *idemd.Response {
	body, _ := json.Marshal(v)
	return &idemd.Response{
		Status:  statusCode,
		Headers: []idemd.Header{{Name: "Content-Type", Value: "application/json"}},
		Body:    body,
	}
}

func writeError(w http.ResponseWriter, statusCode int, code string) {
	body, _ := json.Marshal(map[string]string{"error": code})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(statusCode)
	_, _ = w.Write(body)
}

// FakeProvider is an in-memory payment provider that honours idempotency
// keys like a real one: the same key returns the first charge again.
type FakeProvider struct {
	mu      sync.Mutex
	charges map[string]Charge
}

// Charge charges once per idempotency key.
func (f *FakeProvider) Charge(_ context.Context, idempotencyKey string, _ Payment) (Charge, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.charges == nil {
		f.charges = map[string]Charge{}
	}
	if c, ok := f.charges[idempotencyKey]; ok {
		return c, nil
	}
	c := Charge{ID: fmt.Sprintf("pay_%d", len(f.charges)+1), Status: "succeeded"}
	f.charges[idempotencyKey] = c
	return c, nil
}

// Charges is how many distinct charges were made.
func (f *FakeProvider) Charges() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.charges)
}
