// Command kafka-consumer is the consumer program of
// clients/conformance/consumer-scenarios.md: a Kafka consumer (franz-go)
// whose handler's side effect (a line appended to a ledger file) runs once
// per message key through idemd.Consumer, across redeliveries, rebalances
// and crashes. The scenario runner (scenarios_test.go) starts it as separate
// processes.
//
//	IDEMD_TOKEN=... kafka-consumer -brokers 127.0.0.1:9092 -topic payments -group payments \
//	  -idemd 127.0.0.1:50051 -insecure -ledger ledger.txt -dead-letters dead.jsonl
//
// The settings of consumer-scenarios.md are flags: -brokers, -topic,
// -group; -idemd (with -insecure for plaintext); -endpoint (default
// kafka:<topic>); -key-header; -lease; -handler-ms; -ledger;
// -dead-letters; -kill-in-handler-after N; -kill-after N; -no-helper. The
// tenant token comes from IDEMD_TOKEN, not a flag, so that it does not show
// in the process list.
//
// It prints a line per outcome other than executed (outcome=duplicate
// partition=P offset=O: positions only, never keys or values) and, on
// exit, a summary with the counts.
//
// The loop: poll (the client's default fetch), hand each record to
// ProcessMessage in partition order, retry a record in place while its
// outcome is Retry, then commit the processed records' offsets and let a
// rebalance in (BlockRebalanceOnPoll: a partition never moves while its
// batch is half processed). SIGTERM: finish the record in hand, commit,
// leave the group, exit 0.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	idemd "github.com/idemd/idemd/clients/go"
)

type config struct {
	brokers, topic, group string
	idemdAddr, endpoint   string
	insecure              bool
	keyHeader             string
	lease                 time.Duration
	handlerMS             int
	ledger, deadLetters   string
	started               string
	killInHandlerAfter    int
	killAfter             int
	noHelper              bool
	mode                  string
	parallelism           int
}

func main() {
	// First of all: a SIGTERM that arrives while the program starts (a
	// scenario may stop a consumer it just launched) must mean "finish and
	// leave", not the default exit.
	stop, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	var cfg config
	flag.StringVar(&cfg.brokers, "brokers", "127.0.0.1:9092", "Kafka bootstrap brokers, comma-separated")
	flag.StringVar(&cfg.topic, "topic", "", "topic to consume")
	flag.StringVar(&cfg.group, "group", "", "consumer group")
	flag.StringVar(&cfg.idemdAddr, "idemd", "127.0.0.1:50051", "idemd address (token: $IDEMD_TOKEN)")
	flag.BoolVar(&cfg.insecure, "insecure", false, "plaintext to idemd (local development only)")
	flag.StringVar(&cfg.endpoint, "endpoint", "", "idemd endpoint of the keys (default kafka:<topic>)")
	flag.StringVar(&cfg.keyHeader, "key-header", "idempotency-key", "header holding each message's idempotency key")
	flag.DurationVar(&cfg.lease, "lease", idemd.DefaultConsumerLease, "lease asked of idemd per claim (extended while the handler runs)")
	flag.IntVar(&cfg.handlerMS, "handler-ms", 0, "the handler sleeps this long before its side effect")
	flag.StringVar(&cfg.ledger, "ledger", "", "the side effect: append the message number to this file")
	flag.StringVar(&cfg.deadLetters, "dead-letters", "", "the dead-letter hook appends a JSON line to this file")
	flag.StringVar(&cfg.started, "started", "", "the handler appends the message number to this file when it starts (optional)")
	flag.IntVar(&cfg.killInHandlerAfter, "kill-in-handler-after", 0, "SIGKILL itself in the handler, after the side effect of message N")
	flag.IntVar(&cfg.killAfter, "kill-after", 0, "SIGKILL itself after the helper reports message N done, before committing it")
	flag.BoolVar(&cfg.noHelper, "no-helper", false, "negative control: run the handler on every delivery, no idemd")
	flag.StringVar(&cfg.mode, "mode", "sequential", "sequential (ProcessMessage, one message in hand), pipelined "+
		"(ProcessBatch, each partition in offset order, partitions side by side) or parallel (ProcessBatch, keys side by side)")
	flag.IntVar(&cfg.parallelism, "parallelism", 0, "handlers at once in the pipelined and parallel modes (default idemd.DefaultParallelism)")
	flag.Parse()
	switch cfg.mode {
	case "sequential", "pipelined", "parallel":
	default:
		fmt.Fprintln(os.Stderr, "kafka-consumer: -mode is sequential, pipelined or parallel")
		os.Exit(2)
	}
	if cfg.topic == "" || cfg.group == "" || cfg.ledger == "" || cfg.deadLetters == "" {
		fmt.Fprintln(os.Stderr, "kafka-consumer: -topic, -group, -ledger and -dead-letters are required")
		os.Exit(2)
	}
	if cfg.endpoint == "" {
		cfg.endpoint = "kafka:" + cfg.topic
	}
	// Once stopping, further signals are ignored: the shutdown (the last
	// commit, leaving the group, the summary) must finish, and stop's
	// cancel would otherwise restore the default action mid-way.
	go func() {
		<-stop.Done()
		signal.Ignore(syscall.SIGTERM, syscall.SIGINT)
	}()
	err := run(stop, cfg)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kafka-consumer:", err)
		os.Exit(1)
	}
}

// payload is the scenarios' message value.
type payload struct {
	N      int  `json:"n"`
	Poison bool `json:"poison"`
	Amount int  `json:"amount"`
}

func number(value []byte) int {
	var p payload
	_ = json.Unmarshal(value, &p)
	return p.N
}

// appender appends whole lines with one write each to an O_APPEND file, so
// that concurrent consumers' lines never interleave.
type appender struct {
	mu sync.Mutex
	f  *os.File
}

func openAppender(path string) (*appender, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	return &appender{f: f}, nil
}

func (a *appender) line(b []byte) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, err := a.f.Write(append(b, '\n'))
	return err
}

func killSelf() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL) }

func run(stop context.Context, cfg config) error {
	ledger, err := openAppender(cfg.ledger)
	if err != nil {
		return err
	}
	dead, err := openAppender(cfg.deadLetters)
	if err != nil {
		return err
	}

	var started *appender
	if cfg.started != "" {
		if started, err = openAppender(cfg.started); err != nil {
			return err
		}
	}
	// The handler: poison raises before any side effect; otherwise sleep,
	// then the side effect.
	handle := func(ctx context.Context, msg idemd.Message, _ idemd.Execution) error {
		var p payload
		if err := json.Unmarshal(msg.Value, &p); err != nil {
			return fmt.Errorf("undecodable message: %w", err)
		}
		if started != nil {
			if err := started.line(fmt.Appendf(nil, "%d", p.N)); err != nil {
				return err
			}
		}
		if p.Poison {
			return fmt.Errorf("poison message %d", p.N)
		}
		time.Sleep(time.Duration(cfg.handlerMS) * time.Millisecond)
		if err := ledger.line(fmt.Appendf(nil, "%d", p.N)); err != nil {
			return err
		}
		if p.N == cfg.killInHandlerAfter {
			killSelf()
		}
		return nil
	}
	// A repeated call appends the same line again; readers of the file
	// take the set of messages, which makes the hook idempotent.
	deadLetter := func(_ context.Context, msg idemd.Message, reason string) error {
		line, err := json.Marshal(struct {
			Message int    `json:"message"`
			Reason  string `json:"reason"`
		}{number(msg.Value), reason})
		if err != nil {
			return err
		}
		return dead.line(line)
	}

	// processBatch: the pipelined and parallel modes' whole-poll helper;
	// nil in sequential mode and without the helper.
	var processBatch func(context.Context, []idemd.Message) []idemd.Outcome
	process := func(ctx context.Context, msg idemd.Message) idemd.Outcome {
		if err := handle(ctx, msg, idemd.Execution{}); err != nil {
			if dlErr := deadLetter(ctx, msg, err.Error()); dlErr != nil {
				return idemd.Outcome{Action: idemd.Retry, Err: dlErr}
			}
			return idemd.Outcome{Action: idemd.DeadLettered, Reason: err.Error()}
		}
		return idemd.Outcome{Action: idemd.Executed}
	}
	if !cfg.noHelper {
		client, err := idemdClient(cfg)
		if err != nil {
			return err
		}
		defer client.Close()
		consumer, err := idemd.NewConsumer(client, cfg.endpoint, idemd.KeyFromHeader(cfg.keyHeader), deadLetter,
			idemd.WithLease(cfg.lease))
		if err != nil {
			return err
		}
		process = func(ctx context.Context, msg idemd.Message) idemd.Outcome {
			return consumer.ProcessMessage(ctx, msg, handle)
		}
		if cfg.mode != "sequential" {
			opts := idemd.BatchOptions{Ordering: idemd.PerKey, Parallelism: cfg.parallelism}
			if cfg.mode == "pipelined" {
				opts.Ordering = idemd.PerPartition
			}
			processBatch = func(ctx context.Context, msgs []idemd.Message) []idemd.Outcome {
				return consumer.ProcessBatch(ctx, msgs, handle, opts)
			}
		}
	}

	kafka, err := kgo.NewClient(
		kgo.SeedBrokers(strings.Split(cfg.brokers, ",")...),
		kgo.ConsumerGroup(cfg.group),
		kgo.ConsumeTopics(cfg.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		// A consumer that dies loses its partitions within seconds, not
		// the default 45 s.
		kgo.SessionTimeout(6*time.Second),
		kgo.HeartbeatInterval(time.Second),
	)
	if err != nil {
		return err
	}
	// Close leaves the group; with auto-commit off it commits nothing.
	defer kafka.Close()

	counts := &tally{}
	defer counts.print()

	for stop.Err() == nil {
		fetches := kafka.PollFetches(stop)
		if fetches.IsClientClosed() {
			return nil
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if !errors.Is(err, context.Canceled) {
				fmt.Fprintf(os.Stderr, "kafka-consumer: fetch %s/%d: %v\n", topic, partition, err)
			}
		})
		var done []*kgo.Record
		if processBatch != nil {
			done = processPoll(stop, processBatch, fetches.Records(), counts, cfg.killAfter)
		}
		// Sequential: one record at a time, partition after partition: a
		// process killed in a handler has exactly one message in hand, whose
		// outcome is then unknown (the scenarios count on that).
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if processBatch != nil {
				return
			}
			for _, r := range p.Records {
				if stop.Err() != nil {
					return // the rest stays uncommitted, for the next owner
				}
				if !processUntilDecided(stop, process, message(r), counts) {
					return // shutting down with r undecided: nothing after it either
				}
				if number(r.Value) == cfg.killAfter {
					killSelf()
				}
				done = append(done, r)
			}
		})
		if len(done) > 0 {
			// Not stop: the commit must happen on SIGTERM too.
			ctx, cancelCommit := context.WithTimeout(context.Background(), 10*time.Second)
			err := kafka.CommitRecords(ctx, done...)
			cancelCommit()
			if err != nil {
				// The records run again after a rebalance: duplicates.
				fmt.Fprintf(os.Stderr, "kafka-consumer: commit: %v\n", err)
			}
		}
		kafka.AllowRebalance()
	}
	return nil
}

func message(r *kgo.Record) idemd.Message {
	msg := idemd.Message{Value: r.Value, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}
	for _, h := range r.Headers {
		msg.Headers = append(msg.Headers, idemd.MessageHeader{Key: h.Key, Value: h.Value})
	}
	return msg
}

// processPoll hands the whole poll to ProcessBatch, then the messages it
// says to retry again (after a pause) until each is decided or shutdown
// comes; returns the records that may be committed: per partition, those
// before its first undecided one. killAfter: SIGKILL once that message is
// reported done, before any commit.
func processPoll(stop context.Context, processBatch func(context.Context, []idemd.Message) []idemd.Outcome,
	records []*kgo.Record, counts *tally, killAfter int) []*kgo.Record {
	if len(records) == 0 {
		return nil
	}
	counts.begin()
	undecided := make([]int, len(records))
	for i := range records {
		undecided[i] = i
	}
	decided := make([]bool, len(records))
	pause := 100 * time.Millisecond
	for len(undecided) > 0 {
		msgs := make([]idemd.Message, len(undecided))
		for n, i := range undecided {
			msgs[n] = message(records[i])
		}
		// Not stop: a poll begun is finished on SIGTERM (retries aside).
		outs := processBatch(context.Background(), msgs)
		var again []int
		reason := ""
		for n, i := range undecided {
			counts.add(outs[n], msgs[n])
			if !outs[n].MayCommit() {
				if reason == "" {
					reason = outs[n].Reason
				}
				again = append(again, i)
				continue
			}
			decided[i] = true
			if number(records[i].Value) == killAfter {
				killSelf()
			}
		}
		undecided = again
		if len(undecided) == 0 {
			break
		}
		fmt.Fprintf(os.Stderr, "kafka-consumer: retrying %d messages: %s\n", len(undecided), reason)
		select {
		case <-stop.Done():
			undecided = nil
		case <-time.After(pause):
		}
		pause = min(2*pause, 2*time.Second)
	}
	var done []*kgo.Record
	blocked := map[int32]bool{}
	for i, r := range records {
		if !decided[i] {
			blocked[r.Partition] = true
		}
		if !blocked[r.Partition] {
			done = append(done, r)
		}
	}
	return done
}

// processUntilDecided retries msg in place while the helper says Retry, so
// no later record of its partition goes first; false if shutdown came first.
func processUntilDecided(stop context.Context, process func(context.Context, idemd.Message) idemd.Outcome,
	msg idemd.Message, counts *tally) bool {
	pause := 100 * time.Millisecond
	counts.begin()
	for {
		// Not stop: a message begun is finished on SIGTERM.
		out := process(context.Background(), msg)
		counts.add(out, msg)
		if out.MayCommit() {
			return true
		}
		fmt.Fprintf(os.Stderr, "kafka-consumer: retrying partition %d offset %d: %s\n", msg.Partition, msg.Offset, out.Reason)
		select {
		case <-stop.Done():
			return false
		case <-time.After(pause):
		}
		pause = min(2*pause, 2*time.Second)
	}
}

// tally counts outcomes and reports each one but Executed on stdout, the
// runner's count of skipped duplicates (a killed consumer prints no
// summary). Positions only: keys and values stay out of logs.
type tally struct {
	mu          sync.Mutex
	counts      [idemd.Retry + 1]int
	first, last time.Time // the first message's start, the last one's end
}

func (t *tally) begin() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.first.IsZero() {
		t.first = time.Now()
	}
}

func (t *tally) add(out idemd.Outcome, msg idemd.Message) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.counts[out.Action]++
	t.last = time.Now()
	if out.Action != idemd.Executed {
		fmt.Printf("outcome=%s partition=%d offset=%d\n", out.Action, msg.Partition, msg.Offset)
	}
}

func (t *tally) print() {
	t.mu.Lock()
	defer t.mu.Unlock()
	// span_ms: first message in to last message out, the throughput bench's
	// clock (group joins and idle polls left out).
	fmt.Printf("summary executed=%d duplicates=%d dead_lettered=%d retries=%d span_ms=%d\n", t.counts[idemd.Executed],
		t.counts[idemd.Duplicate], t.counts[idemd.DeadLettered], t.counts[idemd.Retry], t.last.Sub(t.first).Milliseconds())
}

func idemdClient(cfg config) (*idemd.Client, error) {
	opts := []idemd.Option{idemd.WithToken(os.Getenv("IDEMD_TOKEN"))}
	if cfg.insecure {
		opts = append(opts, idemd.WithInsecure())
	}
	return idemd.New(cfg.idemdAddr, opts...)
}
