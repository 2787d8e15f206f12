package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestConsumerThroughput is the throughput bench (clients/go/bench/consumer.sh
// runs it; it is skipped unless IDEMD_CONSUMER_BENCH is set): one consumer
// program, 4 partitions, 10,000 messages with distinct keys, handler 0 ms,
// the client's default fetch, without the helper (no-helper mode) and with
// it in each mode (IDEMD_CONSUMER_BENCH_MODES, default "parallel pipelined
// sequential"), IDEMD_CONSUMER_BENCH_RUNS runs of each (default 3), in turn;
// IDEMD_CONSUMER_BENCH_PARALLELISM sets the program's -parallelism. It
// prints messages/s over span_ms, the consumer's first-message-in to
// last-message-out (group join and idle polls left out), and over the wall
// time from the consumer's start to the group's commits reaching the end.
func TestConsumerThroughput(t *testing.T) {
	if os.Getenv("IDEMD_CONSUMER_BENCH") == "" {
		t.Skip("the throughput bench: set IDEMD_CONSUMER_BENCH=1 (clients/go/bench/consumer.sh)")
	}
	runs := 3
	if n, err := strconv.Atoi(os.Getenv("IDEMD_CONSUMER_BENCH_RUNS")); err == nil && n > 0 {
		runs = n
	}
	const messages, partitions = 10000, 4
	e := scenarioEnv(t)
	modes := strings.Fields(os.Getenv("IDEMD_CONSUMER_BENCH_MODES"))
	if len(modes) == 0 {
		modes = []string{"parallel", "pipelined", "sequential"}
	}
	for run := 1; run <= runs; run++ {
		for _, mode := range append([]string{"no-helper"}, modes...) {
			span, wall, err := e.throughputRun(t, messages, partitions, mode)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Printf("run %d, %-10s: %6.0f msg/s (span %v), %6.0f msg/s wall (%v)\n", run, mode,
				float64(messages)/span.Seconds(), span, float64(messages)/wall.Seconds(), wall.Round(time.Millisecond))
		}
	}
}

var spanMS = regexp.MustCompile(`summary executed=(\d+) .*span_ms=(\d+)`)

// throughputRun is one run in mode: "no-helper", or the program's -mode.
func (e *env) throughputRun(t *testing.T, messages, partitions int, mode string) (span, wall time.Duration, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	prefix := randomHex(t)
	topic := "throughput-" + prefix
	created, err := e.admin.CreateTopics(ctx, int32(partitions), 1, nil, topic)
	if err == nil {
		err = created.Error()
	}
	if err != nil {
		return 0, 0, err
	}
	var s scenario
	s.Produce.Messages = messages
	set := scenarioSettings{Partitions: partitions, KeyHeader: "idempotency-key", Lease: "10s", HandlerMS: new(int)}
	noHelper := mode == "no-helper"
	if !noHelper {
		set.Mode = mode
		set.Parallelism, _ = strconv.Atoi(os.Getenv("IDEMD_CONSUMER_BENCH_PARALLELISM"))
	}
	if err := e.produce(ctx, s, set, topic, prefix); err != nil {
		return 0, 0, err
	}
	dir := t.TempDir()
	started := time.Now()
	p, err := e.start(consumerEntry{Name: "bench"}, set, topic, "group-"+topic,
		filepath.Join(dir, "ledger"), filepath.Join(dir, "dead-letters"), noHelper, "")
	if err != nil {
		return 0, 0, err
	}
	defer p.kill()
	for len(readLedger(filepath.Join(dir, "ledger"))) < messages || !e.committedToEnd(ctx, "group-"+topic, topic) {
		if ctx.Err() != nil || p.hasExited() {
			return 0, 0, fmt.Errorf("the consumer did not finish: %v\n%s", ctx.Err(), p.stderr())
		}
		time.Sleep(20 * time.Millisecond)
	}
	wall = time.Since(started)
	p.terminate()
	if code, _ := p.wait(20 * time.Second); code != 0 {
		return 0, 0, fmt.Errorf("the consumer exited with %d\n%s", code, p.stderr())
	}
	m := spanMS.FindStringSubmatch(p.stdout())
	if m == nil || m[1] != strconv.Itoa(messages) {
		return 0, 0, fmt.Errorf("no summary of %d executions in\n%s", messages, p.stdout())
	}
	ms, _ := strconv.Atoi(m[2])
	return time.Duration(ms) * time.Millisecond, wall, nil
}
