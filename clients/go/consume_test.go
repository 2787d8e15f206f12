package idemd_test

// The consumer helper (consume.go) against a live idemd: one test per
// outcome. The Kafka scenarios are in examples/kafka.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	idemd "github.com/idemd/idemd/clients/go"
	idemdv1 "github.com/idemd/idemd/clients/go/gen/idemd/v1"
)

const messagesEndpoint = "kafka:payments"

// deadLetters records the hook's calls.
type deadLetters struct {
	mu      sync.Mutex
	reasons []string
	fail    error
}

func (d *deadLetters) hook(_ context.Context, _ idemd.Message, reason string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reasons = append(d.reasons, reason)
	return d.fail
}

func (d *deadLetters) got() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.reasons...)
}

func newConsumer(t *testing.T, c *idemd.Client, endpoint string, opts ...idemd.ExecuteOption) (*idemd.Consumer, *deadLetters) {
	t.Helper()
	dl := &deadLetters{}
	consumer, err := idemd.NewConsumer(c, endpoint, idemd.KeyFromHeader("idempotency-key"), dl.hook, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return consumer, dl
}

func message(key, value string) idemd.Message {
	return idemd.Message{Value: []byte(value), Topic: "payments", Partition: 1, Offset: 7,
		Headers: []idemd.MessageHeader{{Key: "idempotency-key", Value: []byte(key)}}}
}

// counting is a handler that counts its runs and returns err.
func counting(runs *atomic.Int32, err error) idemd.MessageHandler {
	return func(context.Context, idemd.Message, idemd.Execution) error {
		runs.Add(1)
		return err
	}
}

func expectAction(t *testing.T, what string, got idemd.Outcome, want idemd.Action) {
	t.Helper()
	if got.Action != want {
		t.Fatalf("%s: %v (reason %q, err %v), want %v", what, got.Action, got.Reason, got.Err, want)
	}
	if got.MayCommit() != (want != idemd.Retry) {
		t.Fatalf("%s: MayCommit %v for %v", what, got.MayCommit(), want)
	}
}

func TestConsumerExecutesOnceAndSkipsDuplicates(t *testing.T) {
	t.Parallel()
	consumer, dl := newConsumer(t, newClient(t), messagesEndpoint)
	msg := message(newKey(t), `{"n":1,"amount":100}`)
	var runs atomic.Int32
	expectAction(t, "first delivery", consumer.ProcessMessage(context.Background(), msg, counting(&runs, nil)), idemd.Executed)
	expectAction(t, "redelivery", consumer.ProcessMessage(context.Background(), msg, counting(&runs, nil)), idemd.Duplicate)
	if runs.Load() != 1 || len(dl.got()) != 0 {
		t.Fatalf("handler ran %d times, dead letters %q", runs.Load(), dl.got())
	}
}

// A handler's error dead-letters the message with the error text (what the
// executor stores), and a redelivery is dead-lettered as unknown without
// running the handler again.
func TestConsumerDeadLettersAHandlerErrorAndItsRedelivery(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	consumer, dl := newConsumer(t, c, messagesEndpoint)
	key := newKey(t)
	msg := message(key, `{"n":4,"poison":true}`)
	var runs atomic.Int32
	out := consumer.ProcessMessage(context.Background(), msg, counting(&runs, errors.New("poison message 4")))
	expectAction(t, "handler error", out, idemd.DeadLettered)
	if out.Reason != "poison message 4" {
		t.Fatalf("reason %q", out.Reason)
	}
	if state := lookupState(t, c, messagesEndpoint, key); state != "UNKNOWN" {
		t.Fatalf("the key is %s after a handler error, want UNKNOWN", state)
	}
	out = consumer.ProcessMessage(context.Background(), msg, counting(&runs, nil))
	expectAction(t, "redelivery", out, idemd.DeadLettered)
	if runs.Load() != 1 {
		t.Fatalf("the handler ran %d times", runs.Load())
	}
	if got := dl.got(); len(got) != 2 || got[0] != "poison message 4" ||
		!strings.HasPrefix(got[1], "outcome unknown: ") || !strings.Contains(got[1], "poison message 4") {
		t.Fatalf("dead-letter reasons %q", got)
	}
}

// A panic is recorded like the executor records it and dead-letters the
// message; ProcessMessage returns instead of panicking.
func TestConsumerDeadLettersAPanic(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	consumer, dl := newConsumer(t, c, messagesEndpoint)
	key := newKey(t)
	out := consumer.ProcessMessage(context.Background(), message(key, `{"n":2}`),
		func(context.Context, idemd.Message, idemd.Execution) error { panic("boom") })
	expectAction(t, "panic", out, idemd.DeadLettered)
	if got := dl.got(); len(got) != 1 || got[0] != "panic: boom" {
		t.Fatalf("dead-letter reasons %q", got)
	}
	if state := lookupState(t, c, messagesEndpoint, key); state != "UNKNOWN" {
		t.Fatalf("the key is %s after a panic, want UNKNOWN", state)
	}
}

func TestConsumerDeadLettersAReusedKey(t *testing.T) {
	t.Parallel()
	consumer, dl := newConsumer(t, newClient(t), messagesEndpoint)
	key := newKey(t)
	var runs atomic.Int32
	expectAction(t, "first", consumer.ProcessMessage(context.Background(), message(key, `{"amount":100}`), counting(&runs, nil)), idemd.Executed)
	out := consumer.ProcessMessage(context.Background(), message(key, `{"amount":999}`), counting(&runs, nil))
	expectAction(t, "other value", out, idemd.DeadLettered)
	var reuse *idemd.KeyReuseError
	if !errors.As(out.Err, &reuse) || !strings.Contains(dl.got()[0], "fingerprint mismatch") || runs.Load() != 1 {
		t.Fatalf("err %v, reasons %q, runs %d", out.Err, dl.got(), runs.Load())
	}
}

func TestConsumerDeadLettersAMessageWithoutItsKeyHeader(t *testing.T) {
	t.Parallel()
	consumer, dl := newConsumer(t, newClient(t), messagesEndpoint)
	var runs atomic.Int32
	msg := idemd.Message{Value: []byte(`{}`), Headers: []idemd.MessageHeader{{Key: "other", Value: []byte("x")}}}
	out := consumer.ProcessMessage(context.Background(), msg, counting(&runs, nil))
	expectAction(t, "no key header", out, idemd.DeadLettered)
	var missing *idemd.MissingKeyError
	if !errors.As(out.Err, &missing) || missing.Header != "idempotency-key" || runs.Load() != 0 ||
		!strings.Contains(dl.got()[0], `"idempotency-key" header`) {
		t.Fatalf("err %v, reasons %q, runs %d", out.Err, dl.got(), runs.Load())
	}
}

// claimRaw takes key with a raw Claim, as another consumer would.
func claimRaw(t *testing.T, c *idemd.Client, endpoint, key, value string, lease time.Duration) *idemdv1.Claimed {
	t.Helper()
	resp, err := c.Claim(context.Background(), &idemdv1.ClaimRequest{Endpoint: endpoint, Key: key,
		Lease: durationpb.New(lease), Fingerprint: &idemdv1.ClaimRequest_Request{Request: &idemdv1.HttpRequest{
			Method: "CONSUME", Path: endpoint, Body: []byte(value)}}})
	if err != nil || resp.GetClaimed() == nil {
		t.Fatalf("raw claim: %v %v", resp, err)
	}
	return resp.GetClaimed()
}

// A holder that outlives the wait means Retry (not committed); one that
// finishes within it means Duplicate.
func TestConsumerWaitsForAHolderThenRetries(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	consumer, dl := newConsumer(t, c, messagesEndpoint, idemd.WithMaxWait(300*time.Millisecond))
	key := newKey(t)
	claimed := claimRaw(t, c, messagesEndpoint, key, `{"n":3}`, 10*time.Second)
	var runs atomic.Int32
	out := consumer.ProcessMessage(context.Background(), message(key, `{"n":3}`), counting(&runs, nil))
	expectAction(t, "held past the wait", out, idemd.Retry)
	var busy *idemd.InProgressError
	if !errors.As(out.Err, &busy) || runs.Load() != 0 || len(dl.got()) != 0 {
		t.Fatalf("err %v, runs %d, dead letters %q", out.Err, runs.Load(), dl.got())
	}

	waiting, _ := newConsumer(t, c, messagesEndpoint, idemd.WithMaxWait(5*time.Second))
	time.AfterFunc(200*time.Millisecond, func() {
		_, _ = c.Complete(context.Background(), &idemdv1.CompleteRequest{Endpoint: messagesEndpoint, Key: key,
			LeaseToken: claimed.GetLeaseToken(), Response: &idemdv1.StoredResponse{Status: 200}})
	})
	expectAction(t, "holder finishes within the wait",
		waiting.ProcessMessage(context.Background(), message(key, `{"n":3}`), counting(&runs, nil)), idemd.Duplicate)
	if runs.Load() != 0 {
		t.Fatalf("the handler ran %d times", runs.Load())
	}
}

// A consumer that died in its handler leaves the key's lease to expire:
// the next delivery is dead-lettered as unknown, never run again.
func TestConsumerDeadLettersAnExpiredLease(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	consumer, dl := newConsumer(t, c, messagesEndpoint)
	key := newKey(t)
	claimRaw(t, c, messagesEndpoint, key, `{"n":5}`, time.Second)
	time.Sleep(1500 * time.Millisecond)
	var runs atomic.Int32
	out := consumer.ProcessMessage(context.Background(), message(key, `{"n":5}`), counting(&runs, nil))
	expectAction(t, "expired lease", out, idemd.DeadLettered)
	if runs.Load() != 0 || !strings.Contains(strings.ToLower(dl.got()[0]), "unknown") {
		t.Fatalf("runs %d, reasons %q", runs.Load(), dl.got())
	}
}

// Under on_expired_lease = takeover the claim comes back with attempt 2:
// the earlier attempt may have had its side effect, so the helper does not
// run the handler, records unknown and dead-letters.
func TestConsumerDeadLettersATakeover(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	const endpoint = "POST /v1/takeover" // its policy takes expired leases over
	consumer, dl := newConsumer(t, c, endpoint)
	key := newKey(t)
	claimRaw(t, c, endpoint, key, `{"n":6}`, time.Second)
	time.Sleep(1500 * time.Millisecond)
	var runs atomic.Int32
	out := consumer.ProcessMessage(context.Background(), message(key, `{"n":6}`), counting(&runs, nil))
	expectAction(t, "taken over", out, idemd.DeadLettered)
	if runs.Load() != 0 || !strings.Contains(dl.got()[0], "taken over") {
		t.Fatalf("runs %d, reasons %q", runs.Load(), dl.got())
	}
	if state := lookupState(t, c, endpoint, key); state != "UNKNOWN" {
		t.Fatalf("the key is %s after a takeover, want UNKNOWN", state)
	}
}

// A handler slower than its lease keeps the key: a duplicate delivered
// meanwhile waits and is skipped, instead of finding the lease expired.
func TestConsumerKeepsTheLeaseOfASlowHandler(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	consumer, dl := newConsumer(t, c, messagesEndpoint, idemd.WithLease(time.Second), idemd.WithMaxWait(5*time.Second))
	msg := message(newKey(t), `{"n":7}`)
	var runs atomic.Int32
	slow := func(context.Context, idemd.Message, idemd.Execution) error {
		runs.Add(1)
		time.Sleep(2500 * time.Millisecond)
		return nil
	}
	first := make(chan idemd.Outcome)
	go func() { first <- consumer.ProcessMessage(context.Background(), msg, slow) }()
	time.Sleep(1800 * time.Millisecond) // past the first lease
	expectAction(t, "duplicate of a slow handler", consumer.ProcessMessage(context.Background(), msg, slow), idemd.Duplicate)
	expectAction(t, "slow handler", <-first, idemd.Executed)
	if runs.Load() != 1 || len(dl.got()) != 0 {
		t.Fatalf("runs %d, dead letters %q", runs.Load(), dl.got())
	}
}

func TestConsumerRetriesWhenIdemdIsUnreachable(t *testing.T) {
	t.Parallel()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := listener.Addr().String()
	listener.Close() // nothing listens there now
	c, err := idemd.New(addr, idemd.WithInsecure(), idemd.WithCallTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	consumer, dl := newConsumer(t, c, messagesEndpoint, idemd.WithTransportRetries(1))
	var runs atomic.Int32
	out := consumer.ProcessMessage(context.Background(), message("k", `{}`), counting(&runs, nil))
	expectAction(t, "idemd unreachable", out, idemd.Retry)
	if runs.Load() != 0 || len(dl.got()) != 0 {
		t.Fatalf("runs %d, dead letters %q", runs.Load(), dl.got())
	}
}

// A failing hook must not let the message be committed unrecorded.
func TestConsumerRetriesWhenTheDeadLetterHookFails(t *testing.T) {
	t.Parallel()
	consumer, dl := newConsumer(t, newClient(t), messagesEndpoint)
	dl.fail = errors.New("dead-letter topic unavailable")
	var runs atomic.Int32
	out := consumer.ProcessMessage(context.Background(), message(newKey(t), `{}`), counting(&runs, errors.New("poison")))
	expectAction(t, "hook failed", out, idemd.Retry)
	if !errors.Is(out.Err, dl.fail) {
		t.Fatalf("err %v", out.Err)
	}
}

func TestKeyFromPosition(t *testing.T) {
	dotted := message("ignored", "")
	dotted.Topic = "eu.pay_ments"
	if key, _ := idemd.KeyFromPosition(dotted); key != "eu_dpay__ments-1-7" {
		t.Fatalf("escaped topic: %q", key)
	}
	key, err := idemd.KeyFromPosition(message("ignored", ""))
	if err != nil || key != "payments-1-7" {
		t.Fatalf("%q %v", key, err)
	}
}

// A consumer asks for DefaultConsumerLease, not the endpoint policy's lease
// (10 s in the conformance idemd.toml), in ProcessMessage and ProcessBatch
// alike: a consumer killed inside its handler holds the redelivered message
// (its partition) about that long (issue 52).
func TestConsumerAsksForItsDefaultLease(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	consumer, _ := newConsumer(t, c, messagesEndpoint)
	var mu sync.Mutex
	var left []time.Duration
	handler := func(ctx context.Context, msg idemd.Message, _ idemd.Execution) error {
		key, _ := msg.Header("idempotency-key")
		resp, err := c.Lookup(ctx, &idemdv1.LookupRequest{Endpoint: messagesEndpoint, Key: string(key)})
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		left = append(left, time.Until(resp.GetRecord().GetLeaseExpiresAt().AsTime()))
		return nil
	}
	expectAction(t, "ProcessMessage", consumer.ProcessMessage(context.Background(), message(newKey(t), `{"n":1}`), handler), idemd.Executed)
	batch := []idemd.Message{message(newKey(t), `{"n":2}`), message(newKey(t), `{"n":3}`)}
	for i, out := range consumer.ProcessBatch(context.Background(), batch, handler, idemd.BatchOptions{}) {
		expectAction(t, fmt.Sprintf("ProcessBatch message %d", i), out, idemd.Executed)
	}
	if len(left) != 3 {
		t.Fatalf("the handler saw %d leases, want 3", len(left))
	}
	for _, d := range left {
		// Just claimed: about the whole lease left (the clock is the same one).
		if d <= idemd.DefaultConsumerLease-2*time.Second || d > idemd.DefaultConsumerLease+200*time.Millisecond {
			t.Fatalf("a handler's lease had %v left, want about DefaultConsumerLease (%v): %v", d, idemd.DefaultConsumerLease, left)
		}
	}
}
