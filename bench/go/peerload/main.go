// Command peer-load drives one closed-loop workload against idemd (gRPC) or
// svix/diom (its HTTP/JSON idempotency API), so that the side-by-side of
// `idemd-bench peers` (docs/benchmarks.md, "idemd and diom") measures both
// with one client, written once, in a language neither server is written in.
//
//	peer-load -system idemd|diom -addr HOST:PORT -mode claim|pair|replay -in-flight 64 -duration 10s
//
// Modes, the same on both systems:
//   - claim: a fresh key claimed and left in progress (lease 60 s), the
//     operation whose side effect has not finished yet;
//   - pair: a fresh key claimed, then completed with a 64-byte response;
//   - replay: a key completed before the window, claimed again: the stored
//     response comes back (idemd: Replayed; diom: "completed").
//
// It prints one JSON object: system, mode, in_flight, ops_per_s, p50_ms,
// p99_ms, p999_ms, errors, first_error. Latency is per operation (a pair
// counts once), from before the first request to after the last answer.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	idemdv1 "github.com/idemd/idemd/clients/go/gen/idemd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"
)

const (
	endpoint = "POST /v1/payments"
	lease    = 60 * time.Second
)

// system is one server's three calls.
type system interface {
	// claim claims key; it returns the lease token when claimed, and
	// whether the key was already completed (a replay).
	claim(ctx context.Context, key string) (token string, replayed bool, err error)
	complete(ctx context.Context, key, token string) error
}

func main() {
	name := flag.String("system", "idemd", "idemd (gRPC) or diom (HTTP/JSON)")
	addr := flag.String("addr", "127.0.0.1:50051", "server address")
	mode := flag.String("mode", "claim", "claim, pair or replay")
	inFlight := flag.Int("in-flight", 64, "operations in flight (one goroutine each)")
	duration := flag.Duration("duration", 10*time.Second, "measured window")
	warmup := flag.Duration("warmup", 2*time.Second, "unmeasured window first")
	token := flag.String("token", "", "diom: its admin_token")
	tenant := flag.String("tenant", "bench", "idemd: x-tenant-id (loopback, no auth)")
	conns := flag.Int("conns", 4, "idemd: gRPC connections, used in turn")
	flag.Parse()
	var sys system
	var err error
	switch *name {
	case "idemd":
		sys, err = newIdemd(*addr, *tenant, *conns)
	case "diom":
		sys = newDiom(*addr, *token, *inFlight)
	default:
		err = fmt.Errorf("unknown -system %q", *name)
	}
	if err == nil {
		err = run(sys, *name, *mode, *inFlight, *duration, *warmup)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peer-load:", err)
		os.Exit(1)
	}
}

func run(sys system, name, mode string, inFlight int, duration, warmup time.Duration) error {
	ctx := context.Background()
	var op func(worker int) error
	switch mode {
	case "claim":
		op = func(int) error {
			_, replayed, err := sys.claim(ctx, fresh())
			if err == nil && replayed {
				err = fmt.Errorf("a fresh key replayed")
			}
			return err
		}
	case "pair":
		op = func(int) error {
			key := fresh()
			token, _, err := sys.claim(ctx, key)
			if err != nil {
				return err
			}
			return sys.complete(ctx, key, token)
		}
	case "replay":
		keys := make([]string, inFlight)
		for i := range keys {
			keys[i] = fresh()
			token, _, err := sys.claim(ctx, keys[i])
			if err == nil {
				err = sys.complete(ctx, keys[i], token)
			}
			if err != nil {
				return fmt.Errorf("storing the replayed keys: %w", err)
			}
		}
		op = func(worker int) error {
			_, replayed, err := sys.claim(ctx, keys[worker])
			if err == nil && !replayed {
				err = fmt.Errorf("a completed key did not replay")
			}
			return err
		}
	default:
		return fmt.Errorf("unknown -mode %q", mode)
	}

	var errors atomic.Int64
	var firstError atomic.Value
	var measuring atomic.Bool
	stop := make(chan struct{})
	samples := make([][]time.Duration, inFlight)
	var wg sync.WaitGroup
	for w := range inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				started := time.Now()
				err := op(w)
				took := time.Since(started)
				if !measuring.Load() {
					continue
				}
				if err != nil {
					errors.Add(1)
					firstError.CompareAndSwap(nil, err.Error())
					continue
				}
				samples[w] = append(samples[w], took)
			}
		}()
	}
	time.Sleep(warmup)
	measuring.Store(true)
	began := time.Now()
	time.Sleep(duration)
	measuring.Store(false)
	elapsed := time.Since(began)
	close(stop)
	wg.Wait()

	all := slices.Concat(samples...)
	slices.Sort(all)
	at := func(q float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[min(len(all)-1, int(float64(len(all))*q))]) / float64(time.Millisecond)
	}
	first, _ := firstError.Load().(string)
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"system": name, "mode": mode, "in_flight": inFlight,
		"ops_per_s": float64(len(all)) / elapsed.Seconds(),
		"p50_ms":    at(0.50), "p99_ms": at(0.99), "p999_ms": at(0.999),
		"errors": errors.Load(), "first_error": first,
	})
}

// fresh is a key no earlier operation used.
func fresh() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var response = bytes.Repeat([]byte("r"), 64)

// idemd over gRPC, as the SDKs call it.
type idemd struct {
	stubs []idemdv1.IdempotencyClient
	next  atomic.Uint64
	md    metadata.MD
	hash  []byte
}

func newIdemd(addr, tenant string, conns int) (*idemd, error) {
	s := &idemd{md: metadata.Pairs("x-tenant-id", tenant), hash: make([]byte, 32)}
	for range max(conns, 1) {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		s.stubs = append(s.stubs, idemdv1.NewIdempotencyClient(conn))
	}
	return s, nil
}

func (s *idemd) stub() idemdv1.IdempotencyClient {
	return s.stubs[s.next.Add(1)%uint64(len(s.stubs))]
}

func (s *idemd) claim(ctx context.Context, key string) (string, bool, error) {
	res, err := s.stub().Claim(metadata.NewOutgoingContext(ctx, s.md), &idemdv1.ClaimRequest{
		Endpoint: endpoint, Key: key, Fingerprint: &idemdv1.ClaimRequest_Sha256{Sha256: s.hash},
		Lease: durationpb.New(lease)})
	switch {
	case err != nil:
		return "", false, err
	case res.GetClaimed() != nil:
		return res.GetClaimed().GetLeaseToken(), false, nil
	case res.GetReplayed() != nil:
		return "", true, nil
	}
	return "", false, fmt.Errorf("claim answered %v", res)
}

func (s *idemd) complete(ctx context.Context, key, token string) error {
	_, err := s.stub().Complete(metadata.NewOutgoingContext(ctx, s.md), &idemdv1.CompleteRequest{
		Endpoint: endpoint, Key: key, LeaseToken: token,
		Response: &idemdv1.StoredResponse{Status: 201, Body: response}})
	return err
}

// diom over its HTTP/JSON API (bearer admin_token).
type diom struct {
	base, token string
	client      *http.Client
}

func newDiom(addr, token string, inFlight int) *diom {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConns = inFlight
	transport.MaxIdleConnsPerHost = inFlight
	return &diom{base: "http://" + addr, token: token, client: &http.Client{Transport: transport}}
}

func (s *diom) post(ctx context.Context, path string, body any, out any) error {
	payload, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.base+path, bytes.NewReader(payload))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.token)
	res, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	answer, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if res.StatusCode/100 != 2 {
		return fmt.Errorf("%s answered %d: %.200s", path, res.StatusCode, answer)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(answer, out)
}

func (s *diom) claim(ctx context.Context, key string) (string, bool, error) {
	var res struct {
		Status string `json:"status"`
	}
	err := s.post(ctx, "/api/v1.idempotency.start",
		map[string]any{"key": key, "lock_period_ms": lease.Milliseconds()}, &res)
	switch {
	case err != nil:
		return "", false, err
	case res.Status == "started":
		return "", false, nil
	case res.Status == "completed":
		return "", true, nil
	}
	return "", false, fmt.Errorf("start answered %q", res.Status)
}

func (s *diom) complete(ctx context.Context, key, _ string) error {
	// diom takes the response as a JSON array of byte values.
	values := make([]int, len(response))
	for i, b := range response {
		values[i] = int(b)
	}
	return s.post(ctx, "/api/v1.idempotency.complete",
		map[string]any{"key": key, "response": values, "ttl_ms": (24 * time.Hour).Milliseconds()}, nil)
}
