package idemd

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/status"

	idemdv1 "github.com/idemd/idemd/clients/go/gen/idemd/v1"
)

// Message is a broker's record as the consumer helper sees it. The caller
// builds it from any client's record (Kafka, a queue, a stream); the helper
// reads only what is here.
type Message struct {
	// Value is the payload: the fingerprint, so a reused key with another
	// value is refused.
	Value     []byte
	Headers   []MessageHeader
	Topic     string
	Partition int32
	Offset    int64
}

// MessageHeader is one record header; order and repeats are kept.
type MessageHeader struct {
	Key   string
	Value []byte
}

// Header returns the value of the last header named name, as Kafka's
// Headers.lastHeader does (and every SDK's helper, so that consumers in
// different languages derive one key: clients/conformance/consumer-key-v1.json).
func (m Message) Header(name string) ([]byte, bool) {
	for i := len(m.Headers) - 1; i >= 0; i-- {
		if m.Headers[i].Key == name {
			return m.Headers[i].Value, true
		}
	}
	return nil, false
}

// KeyFunc derives a message's idempotency key. An error makes the message
// undeliverable: ProcessMessage hands it to the dead-letter hook.
type KeyFunc func(Message) (string, error)

// MissingKeyError: the message has no usable key header.
type MissingKeyError struct{ Header string }

func (e *MissingKeyError) Error() string {
	return fmt.Sprintf("idemd: the message has no non-empty %q header to take its idempotency key from", e.Header)
}

// KeyFromHeader takes the key from header name, which every message must
// carry (non-empty): set it in the producer to the operation's own
// identifier (an idempotency key, a message id), so that the same operation
// produced twice, by a producer retry or by two services, has one key.
func KeyFromHeader(name string) KeyFunc {
	return func(m Message) (string, error) {
		v, ok := m.Header(name)
		if !ok || len(v) == 0 {
			return "", &MissingKeyError{Header: name}
		}
		return string(v), nil
	}
}

// KeyFromPosition is the fallback key "<topic>-<partition>-<offset>", for
// producers that set no key header. idemd keys are [A-Za-z0-9_-], so "/"
// cannot separate and the topic's "_" is written "__" and "." "_d": distinct
// topics stay distinct, and the numeric partition and offset read
// unambiguously from the right (every SDK spells it so, since consumers in
// different languages may share a group). It catches redeliveries of one record
// (a rebalance, a crash before the offset commit) but not the same payload
// produced twice: a producer's retry is a new record at a new offset, so it
// runs again. Prefer KeyFromHeader. A topic whose key would pass idemd's 255
// characters is replaced by "h_" and the first 32 hex digits of its SHA-256.
func KeyFromPosition(m Message) (string, error) {
	suffix := "-" + strconv.FormatInt(int64(m.Partition), 10) + "-" + strconv.FormatInt(m.Offset, 10)
	topic := strings.NewReplacer("_", "__", ".", "_d").Replace(m.Topic)
	if len(topic)+len(suffix) > maxKeyChars {
		// A topic too long for idemd's 255 characters (Kafka allows 249,
		// and escaping lengthens it): the first 32 hex digits of its
		// SHA-256 stand in for it, as in every SDK.
		digest := sha256.Sum256([]byte(m.Topic))
		topic = "h_" + hex.EncodeToString(digest[:16])
	}
	return topic + suffix, nil
}

// MessageHandler runs a message's side effect. An error (or a panic) sends
// the message to the dead-letter hook: the key's outcome is recorded as
// unknown with the error text as reason (NoSideEffect releases it instead),
// and the message is not run again silently. ex.DownstreamKey gives the
// idempotency key for a third-party call.
type MessageHandler func(ctx context.Context, msg Message, ex Execution) error

// DeadLetterFunc receives a message that must not run (again) without a
// human or a reconciler: its handler failed, or an earlier attempt's outcome
// is failed or unknown, or its key is missing or reused with another value.
// It is called at least once per such delivery (again if the message is
// redelivered before its offset is committed): make it idempotent. An error
// turns the outcome into OutcomeRetry, so the message is not committed.
type DeadLetterFunc func(ctx context.Context, msg Message, reason string) error

// Action is what ProcessMessage did with a message.
type Action int

const (
	// Executed: the handler ran and its success is recorded.
	Executed Action = iota + 1
	// Duplicate: an earlier delivery already succeeded; the handler did not run.
	Duplicate
	// DeadLettered: the dead-letter hook took the message with a reason.
	DeadLettered
	// Retry: nothing is decided (another consumer holds the key past the
	// wait, idemd is unreachable, the hook failed): do not commit; process
	// the message again before any later one of its partition.
	Retry
)

func (a Action) String() string {
	switch a {
	case Executed:
		return "executed"
	case Duplicate:
		return "duplicate"
	case DeadLettered:
		return "dead_lettered"
	case Retry:
		return "retry"
	}
	return "Action(" + strconv.Itoa(int(a)) + ")"
}

// Outcome is ProcessMessage's answer to the consumer loop.
type Outcome struct {
	Action Action
	// Reason is what the dead-letter hook was given (DeadLettered), or why
	// the message must be retried (Retry).
	Reason string
	// Err is the error behind DeadLettered or Retry, for errors.As
	// (*MissingKeyError, *KeyReuseError, *OutcomePendingError,
	// *InProgressError, a gRPC status, the handler's or the hook's error).
	Err error
}

// MayCommit reports whether the message's offset may be committed: after
// every action but Retry.
func (o Outcome) MayCommit() bool { return o.Action != Retry }

// Consumer runs a per-message handler at most once per key, across
// redeliveries, consumers of a group and restarts, on the executor
// (ExecuteOnce: claim, run with the lease extended, complete or fail).
// Create it once; it is safe for concurrent use.
type Consumer struct {
	client     *Client
	endpoint   string
	key        KeyFunc
	deadLetter DeadLetterFunc
	opts       []ExecuteOption
}

// NewConsumer makes the helper for one endpoint (e.g. "kafka:payments"; a
// key is unique per endpoint). key is KeyFromHeader(name) or
// KeyFromPosition; deadLetter is required. opts are ExecuteOnce's: WithLease
// (the handler's lease, extended while it runs; default
// DefaultConsumerLease), WithMaxWait (how long a
// duplicate waits for a consumer still running it before Retry, default
// DefaultMaxWait), WithTTL (the dedup window: longer than the topic's
// retention, or a replay from the start of the topic runs again),
// WithTransportRetries.
func NewConsumer(client *Client, endpoint string, key KeyFunc, deadLetter DeadLetterFunc,
	opts ...ExecuteOption) (*Consumer, error) {
	switch {
	case client == nil:
		return nil, errors.New("idemd: NewConsumer: nil client")
	case endpoint == "":
		return nil, errors.New("idemd: NewConsumer: empty endpoint")
	case key == nil:
		return nil, errors.New("idemd: NewConsumer: nil key function")
	case deadLetter == nil:
		return nil, errors.New("idemd: NewConsumer: nil dead-letter hook")
	}
	// The default lease first, so that a WithLease among opts wins.
	opts = append([]ExecuteOption{WithLease(DefaultConsumerLease)}, opts...)
	return &Consumer{client: client, endpoint: endpoint, key: key, deadLetter: deadLetter, opts: opts}, nil
}

// maxKeyChars is idemd's longest key.
const maxKeyChars = 255

// DefaultConsumerLease is the lease a Consumer asks for unless WithLease
// says otherwise. The helper extends it at half its length while the
// handler runs, so a slow handler keeps its key; what the short lease buys
// is the stall after a consumer dies inside a handler: the message's next
// delivery waits at most this long (not the endpoint policy's default,
// 60 s unless configured) before it is dead-lettered as outcome unknown.
const DefaultConsumerLease = 5 * time.Second

// errTakenOver is the recorded reason when a claim comes back with attempt
// > 1: an earlier consumer's lease expired mid-handler, so its side effect
// may have happened.
var errTakenOver = errors.New("outcome unknown: an earlier attempt's lease expired before it recorded an outcome (taken over)")

// messageStored is what a success stores: the message's effect is the
// handler's, nothing is replayed but the fact that it ran.
var messageStored = &Response{Status: 200}

// ProcessMessage runs handler for msg unless an earlier delivery of its key
// ran it, and says what the loop may do next:
//
//   - Executed: the handler returned nil and its success is recorded;
//   - Duplicate: an earlier delivery succeeded (a holder still running is
//     waited for, up to WithMaxWait);
//   - DeadLettered: the hook got the message and a reason: the handler
//     returned an error or panicked ("panic: <value>", the executor's
//     reason), the key's earlier attempt is failed or unknown (a consumer
//     died in the handler, its lease expired, it was taken over), the key
//     was used with another value, or the key is missing;
//   - Retry: another consumer still holds the key after the wait, idemd is
//     unreachable or refused the call, or the hook failed.
//
// Commit the offset only when Outcome.MayCommit.
func (c *Consumer) ProcessMessage(ctx context.Context, msg Message, handler MessageHandler) (out Outcome) {
	key, err := c.key(msg)
	if err == nil && key == "" {
		err = errors.New("idemd: the key function returned an empty key")
	}
	if err != nil {
		return c.deadLettered(ctx, msg, err.Error(), err)
	}
	var handlerErr error
	ran := false
	defer func() {
		// The executor records a panic as unknown and lets it continue; the
		// loop must go on with the next message, so it stops here.
		if r := recover(); r != nil {
			out = c.deadLettered(ctx, msg, panicReason(r), fmt.Errorf("idemd: handler panicked: %v", r))
		}
	}()
	// The one fingerprint every SDK's helper sends (consumer-scenarios.md):
	// method CONSUME, path the endpoint, the value's bytes, no content type
	// (so no JSON canonicalization).
	req := HTTPRequest{Method: "CONSUME", Path: c.endpoint, Body: msg.Value}
	_, err = c.client.ExecuteOnce(ctx, c.endpoint, key, req, func(ctx context.Context, ex Execution) (*Response, error) {
		ran = true
		if ex.Attempt > 1 {
			handlerErr = errTakenOver
			return nil, handlerErr
		}
		handlerErr = handler(ctx, msg, ex)
		if handlerErr != nil {
			return nil, handlerErr
		}
		return messageStored, nil
	}, c.opts...)
	return c.classify(ctx, msg, ran, handlerErr, err)
}

// classify turns ExecuteOnce's answer into an Outcome.
func (c *Consumer) classify(ctx context.Context, msg Message, ran bool, handlerErr, err error) Outcome {
	var (
		reuse    *KeyReuseError
		pending  *OutcomePendingError
		busy     *InProgressError
		complete *CompleteError
	)
	switch {
	case err == nil && ran:
		return Outcome{Action: Executed}
	case err == nil:
		return Outcome{Action: Duplicate}
	case ran && handlerErr != nil && errors.Is(err, handlerErr):
		// The executor stored handlerErr.Error() as the reason (or released
		// the key for NoSideEffect): the hook gets the same text.
		return c.deadLettered(ctx, msg, handlerErr.Error(), err)
	case errors.As(err, &complete):
		return c.deadLettered(ctx, msg,
			"outcome unknown: the handler ran but its success could not be recorded: "+status.Code(complete.Err).String(), err)
	case errors.As(err, &reuse):
		return c.deadLettered(ctx, msg,
			"fingerprint mismatch: the key was used earlier with a different message value ("+reuse.ErrorCode+")", err)
	case errors.As(err, &pending):
		return c.deadLettered(ctx, msg, pendingReason(pending), err)
	case errors.As(err, &busy):
		return Outcome{Action: Retry, Reason: "another consumer holds the key past the wait", Err: err}
	}
	return Outcome{Action: Retry, Reason: "idemd call failed: " + status.Code(err).String(), Err: err}
}

// pendingReason names the earlier attempt's state first ("outcome unknown",
// "outcome failed"), then idemd's recorded reason.
func pendingReason(p *OutcomePendingError) string {
	state := "unknown"
	if p.State == idemdv1.State_STATE_FAILED {
		state = "failed"
	}
	reason := "outcome " + state + ": an earlier attempt did not record a success"
	if p.Reason != "" {
		reason += ": " + p.Reason
	}
	return reason
}

func (c *Consumer) deadLettered(ctx context.Context, msg Message, reason string, cause error) Outcome {
	if err := c.callDeadLetter(ctx, msg, reason); err != nil {
		return Outcome{Action: Retry, Reason: "the dead-letter hook failed", Err: errors.Join(cause, err)}
	}
	return Outcome{Action: DeadLettered, Reason: reason, Err: cause}
}

// callDeadLetter turns a panicking hook into an error: the message is then
// retried rather than committed unrecorded.
func (c *Consumer) callDeadLetter(ctx context.Context, msg Message, reason string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("idemd: dead-letter hook panicked: %v", r)
		}
	}()
	return c.deadLetter(ctx, msg, reason)
}
