package idemd_test

// ProcessBatch (consume_batch.go) against a live idemd: outcomes as
// ProcessMessage's, orderings, the crash bound's mechanism (only the round
// in hand is claimed), and the fallback against a server without
// ClaimBatch.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idemd "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/clients/go/internal/testserver"
)

// poll is n messages over partitions 0..parts-1 (offset = index), keys
// prefix-0..prefix-(n-1), value {"n":i}.
func poll(prefix string, n, parts int) []idemd.Message {
	msgs := make([]idemd.Message, n)
	for i := range msgs {
		msgs[i] = idemd.Message{Value: fmt.Appendf(nil, `{"n":%d}`, i), Topic: "payments",
			Partition: int32(i % parts), Offset: int64(i),
			Headers: []idemd.MessageHeader{{Key: "idempotency-key", Value: fmt.Appendf(nil, "%s-%d", prefix, i)}}}
	}
	return msgs
}

// ledger counts each message number's handler runs.
type ledger struct {
	mu   sync.Mutex
	runs map[string]int
}

func (l *ledger) handler(fail map[string]bool) idemd.MessageHandler {
	return func(_ context.Context, msg idemd.Message, _ idemd.Execution) error {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.runs == nil {
			l.runs = map[string]int{}
		}
		l.runs[string(msg.Value)]++
		if fail[string(msg.Value)] {
			return fmt.Errorf("poison %s", msg.Value)
		}
		return nil
	}
}

func actions(outs []idemd.Outcome) map[idemd.Action]int {
	n := map[idemd.Action]int{}
	for _, o := range outs {
		n[o.Action]++
	}
	return n
}

// A poll of 700 messages (two ClaimBatch chunks in one round), 3 of them
// repeats of an earlier message's key and value, 2 poison: each key's
// handler runs once, the repeats are Duplicates, the poison messages are
// dead-lettered, and the same poll redelivered runs nothing.
func TestProcessBatchRunsEachKeyOnce(t *testing.T) {
	t.Parallel()
	consumer, dl := newConsumer(t, newClient(t), messagesEndpoint)
	msgs := poll(newKey(t), 700, 4)
	// Two values past the server's 1 MiB body limit (500 claims that sent
	// them would also pass its 5 MiB message cap): the helper sends their
	// fingerprint.
	for _, i := range []int{100, 101} {
		msgs[i].Value = fmt.Appendf(bytes.Repeat([]byte(" "), 2<<20), `{"n":%d}`, i)
	}
	for _, i := range []int{10, 20, 30} { // repeats, as a producer retry makes them
		msgs = append(msgs, msgs[i])
	}
	poison := map[string]bool{`{"n":5}`: true, `{"n":600}`: true}
	var l ledger
	outs := consumer.ProcessBatch(context.Background(), msgs, l.handler(poison), idemd.BatchOptions{Parallelism: 1000})
	if len(outs) != len(msgs) {
		t.Fatalf("%d outcomes for %d messages", len(outs), len(msgs))
	}
	if got := actions(outs); got[idemd.Executed] != 698 || got[idemd.Duplicate] != 3 || got[idemd.DeadLettered] != 2 {
		t.Fatalf("outcomes %v", got)
	}
	for i, o := range outs {
		want := idemd.Executed
		switch {
		case i >= 700:
			want = idemd.Duplicate
		case poison[string(msgs[i].Value)]:
			want = idemd.DeadLettered
		}
		expectAction(t, fmt.Sprintf("message %d", i), o, want)
	}
	for value, runs := range l.runs {
		if runs != 1 {
			t.Fatalf("%s ran %d times", value, runs)
		}
	}
	if len(l.runs) != 700 || len(dl.got()) != 2 || !strings.Contains(dl.got()[0], "poison") {
		t.Fatalf("%d ran, dead letters %q", len(l.runs), dl.got())
	}

	again := consumer.ProcessBatch(context.Background(), msgs, l.handler(nil), idemd.BatchOptions{})
	if got := actions(again); got[idemd.Duplicate] != 701 || got[idemd.DeadLettered] != 2 {
		t.Fatalf("redelivered: %v", got)
	}
	if len(l.runs) != 700 {
		t.Fatalf("a redelivery ran a handler: %d", len(l.runs))
	}
	// The single-message helper sees the same fingerprints.
	for _, i := range []int{0, 100} {
		expectAction(t, fmt.Sprintf("message %d through ProcessMessage", i),
			consumer.ProcessMessage(context.Background(), msgs[i], l.handler(nil)), idemd.Duplicate)
	}
	for _, reason := range dl.got()[2:] {
		if !strings.Contains(reason, "outcome unknown") || !strings.Contains(reason, "poison") {
			t.Fatalf("redelivered poison: %q", reason)
		}
	}
}

// PerPartition runs each partition's messages in offset order, at most one
// per partition at a time; a message held by another consumer past the
// wait is Retry, and so is every later message of its partition, untouched.
func TestProcessBatchPerPartitionKeepsOffsetOrder(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	consumer, _ := newConsumer(t, c, messagesEndpoint, idemd.WithMaxWait(200*time.Millisecond))
	prefix := newKey(t)
	msgs := poll(prefix, 60, 3)
	claimRaw(t, c, messagesEndpoint, prefix+"-30", `{"n":30}`, 30*time.Second) // partition 0

	var mu sync.Mutex
	last := map[int32]int64{}
	var running, most atomic.Int32
	handler := func(_ context.Context, msg idemd.Message, _ idemd.Execution) error {
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		mu.Lock()
		prev, seen := last[msg.Partition]
		last[msg.Partition] = msg.Offset
		mu.Unlock()
		if seen && msg.Offset <= prev {
			return fmt.Errorf("partition %d: offset %d after %d", msg.Partition, msg.Offset, prev)
		}
		time.Sleep(2 * time.Millisecond)
		return nil
	}
	outs := consumer.ProcessBatch(context.Background(), msgs, handler, idemd.BatchOptions{Ordering: idemd.PerPartition})
	for i, o := range outs {
		want := idemd.Executed
		if i%3 == 0 && i >= 30 {
			want = idemd.Retry
		}
		expectAction(t, fmt.Sprintf("message %d (partition %d)", i, i%3), o, want)
	}
	if most.Load() > 3 {
		t.Fatalf("%d handlers ran at once over 3 partitions", most.Load())
	}
	if last[0] != 27 {
		t.Fatalf("partition 0 went past its held message: last offset %d", last[0])
	}
}

// The crash bound's mechanism: while a round's handlers run, no later
// message of the poll is claimed, so a process killed now would park only
// the round in hand.
func TestProcessBatchClaimsOnlyTheRoundInHand(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	consumer, _ := newConsumer(t, c, messagesEndpoint)
	prefix := newKey(t)
	msgs := poll(prefix, 20, 1)
	release := make(chan struct{})
	var started atomic.Int32
	handler := func(_ context.Context, msg idemd.Message, _ idemd.Execution) error {
		if started.Add(1) <= 4 {
			<-release
		}
		return nil
	}
	done := make(chan []idemd.Outcome)
	go func() {
		done <- consumer.ProcessBatch(context.Background(), msgs, handler, idemd.BatchOptions{Parallelism: 4})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for started.Load() < 4 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if started.Load() != 4 {
		t.Fatalf("%d handlers started, want the round of 4", started.Load())
	}
	for i := range 20 {
		want := "NOT_FOUND"
		if i < 4 {
			want = "IN_PROGRESS"
		}
		if state := lookupState(t, c, messagesEndpoint, fmt.Sprintf("%s-%d", prefix, i)); state != want {
			t.Fatalf("message %d is %s while the first round runs, want %s", i, state, want)
		}
	}
	close(release)
	if got := actions(<-done); got[idemd.Executed] != 20 {
		t.Fatalf("outcomes %v", got)
	}
}

// A handler slower than its lease keeps it: the heartbeats extend it.
func TestProcessBatchKeepsSlowHandlersLeases(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	consumer, _ := newConsumer(t, c, messagesEndpoint, idemd.WithLease(time.Second))
	msgs := poll(newKey(t), 8, 2)
	handler := func(ctx context.Context, _ idemd.Message, _ idemd.Execution) error {
		select {
		case <-time.After(2500 * time.Millisecond):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	if got := actions(consumer.ProcessBatch(context.Background(), msgs, handler, idemd.BatchOptions{})); got[idemd.Executed] != 8 {
		t.Fatalf("outcomes %v", got)
	}
}

// Against the previous release, which has no ClaimBatch (UNIMPLEMENTED),
// every message goes through ProcessMessage: same outcomes.
func TestProcessBatchFallsBackOnAServerWithoutBatches(t *testing.T) {
	previous := os.Getenv("IDEMD_PREVIOUS_BIN")
	if previous == "" {
		t.Skip("IDEMD_PREVIOUS_BIN is not set (clients/go/test.sh sets it from scripts/previous-release.sh)")
	}
	t.Setenv("IDEMD_BIN", previous)
	srv, err := testserver.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	token, err := testserver.Credential("alice")
	if err != nil {
		t.Fatal(err)
	}
	c, err := idemd.New(srv.Addr, idemd.WithToken(token), idemd.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	consumer, dl := newConsumer(t, c, messagesEndpoint)
	msgs := poll(newKey(t), 30, 3)
	msgs = append(msgs, msgs[4])
	var l ledger
	outs := consumer.ProcessBatch(context.Background(), msgs, l.handler(map[string]bool{`{"n":7}`: true}), idemd.BatchOptions{})
	if got := actions(outs); got[idemd.Executed] != 29 || got[idemd.Duplicate] != 1 || got[idemd.DeadLettered] != 1 {
		t.Fatalf("outcomes %v, dead letters %q", got, dl.got())
	}
	if len(l.runs) != 30 {
		t.Fatalf("%d handlers ran", len(l.runs))
	}
}
