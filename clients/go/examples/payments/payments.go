// Package payments is an example HTTP API that makes POST /v1/payments
// safe to retry with idemd: net/http and one middleware (idemd.Middleware),
// which answers what idemd proxy answers (docs/proxy.md): 400 for a missing
// or malformed Idempotency-Key, the stored response with
// "Idempotent-Replayed: true" on a retry, 409 request_in_progress with
// Retry-After, 409 outcome_pending, 422 idempotency_key_reuse. The handler
// only validates and charges.
package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	idemd "github.com/idemd/idemd/clients/go"
)

// Endpoint is the idemd endpoint (policy name) of the payments route.
const Endpoint = "POST /v1/payments"

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
	// MaxWait is how long a duplicate waits for an in-flight original
	// before its 409 (default 0: at once).
	MaxWait time.Duration
}

// Handler returns the routes, behind the idempotency middleware.
func (s *Server) Handler() (http.Handler, error) {
	mw, err := idemd.Middleware(s.Idemd, idemd.RoutesConfig{
		Routes: []idemd.Route{{Path: "/v1/payments", MaxWait: idemd.Duration(s.MaxWait)}},
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/payments", s.createPayment)
	return mw(mux), nil
}

func (s *Server) createPayment(w http.ResponseWriter, r *http.Request) {
	var payment Payment
	if err := json.NewDecoder(r.Body).Decode(&payment); err != nil || payment.Amount <= 0 || payment.Currency == "" {
		// Refused before anything happened: the key is released, a corrected
		// retry with the same key runs.
		idemd.ReportFailure(r.Context(), idemd.NoSideEffect(errors.New("invalid payment")))
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_payment"})
		return
	}
	ex, _ := idemd.ExecutionFrom(r.Context())
	// The provider's key is derived from ours: every retry of this payment
	// sends the same one, so the provider never charges twice.
	charge, err := s.Provider.Charge(r.Context(), ex.DownstreamKey("charge"), payment)
	switch {
	case errors.Is(err, ErrDeclined):
		writeJSON(w, http.StatusPaymentRequired, map[string]string{"error": "card_declined"}) // stored, replayed
	case errors.Is(err, ErrRejected):
		idemd.ReportFailure(r.Context(), idemd.NoSideEffect(err)) // nothing happened: release the key
		writeJSON(w, http.StatusBadGateway, map[string]string{"error": "payment_rejected"})
	case err != nil:
		idemd.ReportFailure(r.Context(), err) // outcome unknown (timeout, reset): never release
		writeJSON(w, http.StatusBadGateway, map[string]string{"error": "payment_outcome_unknown"})
	default:
		writeJSON(w, http.StatusCreated, map[string]any{
			"id": charge.ID, "amount": payment.Amount, "currency": payment.Currency, "status": charge.Status,
		})
	}
}

func writeJSON(w http.ResponseWriter, statusCode int, v any) {
	body, _ := json.Marshal(v)
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
