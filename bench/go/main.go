// Command bench-go-loop times sequential calls through the Go SDK, one
// request in flight, for idemd-bench's clients phase (bench/src/clients/).
// It prints one JSON object: {"calls":N,"p50_ms":X,"p99_ms":Y}.
//
// Probes:
//   - claim: a raw Claim of a unique key (the SDK's generated stub on the
//     SDK's connection): the executor cannot stop after the Claim;
//   - pair: ExecuteOnce of a unique key, the handler returning a small
//     response (Claim + Complete, what every protected request pays);
//   - replay: ExecuteOnce of one key whose first execution stored a body of
//     -body-bytes bytes (on the no-op server the key's rb<SIZE>- prefix
//     makes it answer a replay of that size), timed after that first call.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	idemd "github.com/idemd/idemd/clients/go"
	idemdv1 "github.com/idemd/idemd/clients/go/gen/idemd/v1"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "idemd or no-op server address")
	tenant := flag.String("tenant", "bench", "x-tenant-id (servers with auth off)")
	endpoint := flag.String("endpoint", "POST /v1/payments", "logical endpoint")
	calls := flag.Int("calls", 200, "timed calls")
	warmup := flag.Int("warmup", 20, "untimed calls first")
	probe := flag.String("probe", "claim", "claim, pair or replay")
	key := flag.String("key", "", "replay: the key (its first execution stores the body)")
	bodyBytes := flag.Int("body-bytes", 1024, "replay: stored body size")
	flag.Parse()
	if err := run(*addr, *tenant, *endpoint, *calls, *warmup, *probe, *key, *bodyBytes); err != nil {
		fmt.Fprintln(os.Stderr, "bench-go-loop:", err)
		os.Exit(1)
	}
}

func run(addr, tenant, endpoint string, calls, warmup int, probe, key string, bodyBytes int) error {
	client, err := idemd.New(addr, idemd.WithTenant(tenant), idemd.WithInsecure())
	if err != nil {
		return err
	}
	defer client.Close()
	ctx := context.Background()
	stub := idemdv1.NewIdempotencyClient(client.Conn())
	request := idemd.HTTPRequest{Method: "POST", Path: "/v1/payments", ContentType: "application/json",
		Body: []byte(`{"amount":4200,"currency":"eur"}`)}
	small := &idemd.Response{Status: 201, Body: []byte(`{"id":"pay_9F2Kx","status":"succeeded","amount":4200}`)}

	var call func() error
	switch probe {
	case "claim":
		digest := make([]byte, 32)
		call = func() error {
			res, err := stub.Claim(ctx, &idemdv1.ClaimRequest{Endpoint: endpoint, Key: unique("gc1"),
				Fingerprint: &idemdv1.ClaimRequest_Sha256{Sha256: digest}})
			if err != nil {
				return err
			}
			if res.GetClaimed() == nil {
				return fmt.Errorf("fresh claim answered %v", res)
			}
			return nil
		}
	case "pair":
		call = func() error {
			res, err := client.ExecuteOnce(ctx, endpoint, unique("gp1"), request,
				func(context.Context, idemd.Execution) (*idemd.Response, error) { return small, nil })
			if err != nil {
				return err
			}
			if res.Replayed {
				return fmt.Errorf("a unique key replayed")
			}
			return nil
		}
	case "replay":
		if key == "" {
			return fmt.Errorf("-probe replay needs -key")
		}
		stored := &idemd.Response{Status: 201, Body: make([]byte, bodyBytes)}
		handler := func(context.Context, idemd.Execution) (*idemd.Response, error) { return stored, nil }
		if _, err := client.ExecuteOnce(ctx, endpoint, key, request, handler); err != nil {
			return fmt.Errorf("storing the replay key: %w", err)
		}
		call = func() error {
			res, err := client.ExecuteOnce(ctx, endpoint, key, request, handler)
			if err != nil {
				return err
			}
			if !res.Replayed || len(res.Response.Body) != bodyBytes {
				return fmt.Errorf("replayed %v with %d body bytes, want a replay of %d",
					res.Replayed, len(res.Response.Body), bodyBytes)
			}
			return nil
		}
	default:
		return fmt.Errorf("unknown -probe %q", probe)
	}

	for range warmup {
		if err := call(); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	sample := make([]time.Duration, calls)
	for i := range sample {
		started := time.Now()
		if err := call(); err != nil {
			return err
		}
		sample[i] = time.Since(started)
	}
	slices.Sort(sample)
	at := func(q float64) float64 {
		if len(sample) == 0 {
			return 0
		}
		return float64(sample[int(float64(len(sample)-1)*q+0.5)]) / float64(time.Millisecond)
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{"calls": calls, "p50_ms": at(0.50), "p99_ms": at(0.99)})
}

// unique is a key no earlier run used.
func unique(prefix string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}
