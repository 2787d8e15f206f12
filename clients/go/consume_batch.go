package idemd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	idemdv1 "github.com/idemd/idemd/clients/go/gen/idemd/v1"
)

// Ordering says which messages of a poll ProcessBatch may run side by side.
type Ordering int

const (
	// PerKey (the default) runs messages with different keys side by side,
	// up to Parallelism at once; two messages with one key run one after the
	// other, in poll order. Side effects of one partition may happen out of
	// offset order; offsets are still committed in order (see ProcessBatch).
	PerKey Ordering = iota
	// PerPartition runs each partition's messages one at a time in offset
	// order, and the partitions of the poll side by side (at most
	// Parallelism of them). Use it when a partition's side effects must
	// happen in order.
	PerPartition
)

// DefaultParallelism is how many messages ProcessBatch has in flight
// (claimed or being claimed, running, being completed) unless BatchOptions
// says otherwise: enough that a 0 ms handler's bookkeeping rides in batches
// of dozens to hundreds of keys, few enough that a crash parks at most that
// many messages (only those whose handler ran).
const DefaultParallelism = 256

// maxBatchItems is the server's limit per ClaimBatch or CompleteBatch.
const maxBatchItems = 500

// BatchOptions configures ProcessBatch; the zero value is PerKey with
// DefaultParallelism.
type BatchOptions struct {
	// Ordering: PerKey (default) or PerPartition.
	Ordering Ordering
	// Parallelism bounds the messages in flight at once, and so the
	// handlers running at once (default DefaultParallelism). 1 is one
	// message at a time in poll order, with the bookkeeping still batched
	// RPCs.
	Parallelism int
}

// ProcessBatch is ProcessMessage for a whole poll: it returns one Outcome
// per message, in msgs' order, each meaning exactly what ProcessMessage's
// would. The bookkeeping is batched and pipelined: as slots free up (at
// most Parallelism messages in flight), the next messages' keys are claimed
// in one ClaimBatch, each claimed handler starts the moment the answer
// arrives (its lease extended by heartbeats while it runs), and finished
// handlers' successes are recorded together in CompleteBatch calls that
// overlap the next claims. A message whose key an earlier message of the
// poll has in flight waits until that one is decided (and is then a
// Duplicate).
//
// Commit offsets in order: for each partition, up to (not including) its
// first message whose Outcome does not MayCommit. With PerKey a later
// message of that partition may already have run; redelivered, it is a
// Duplicate.
//
// The crash bound: a key is claimed only for a free slot, and every claimed
// handler is started as soon as its ClaimBatch answers (nothing else runs
// in between). A process killed at any point therefore parks as
// outcome-unknown at most Parallelism messages, and only those whose
// handler had been started; the rest of the poll was never claimed and
// runs normally on redelivery.
//
// The dead-letter hook is called from several goroutines at once: make it
// safe for concurrent use. Against a server without ClaimBatch
// (UNIMPLEMENTED), each message goes through ProcessMessage instead, still
// up to Parallelism at once.
func (c *Consumer) ProcessBatch(ctx context.Context, msgs []Message, handler MessageHandler, opts BatchOptions) []Outcome {
	if opts.Parallelism <= 0 {
		opts.Parallelism = DefaultParallelism
	}
	b := &batch{c: c, ctx: ctx, msgs: msgs, handler: handler, opts: opts,
		outs: make([]Outcome, len(msgs)), decided: make([]bool, len(msgs)), active: make([]bool, len(msgs)),
		keys: make([]string, len(msgs)), blocked: map[int32]bool{}, events: make(chan func(), 64)}
	b.exec = executeOptions{maxWait: DefaultMaxWait, transportRetries: DefaultTransportRetries}
	for _, opt := range c.opts {
		opt(&b.exec)
	}
	for i, msg := range msgs {
		key, err := c.key(msg)
		if err == nil && key == "" {
			err = errors.New("idemd: the key function returned an empty key")
		}
		if err != nil {
			b.decide(i, c.deadLettered(ctx, msg, err.Error(), err))
			continue
		}
		b.keys[i] = key
	}
	b.activeKeys = map[string]int{}
	b.prevSameKey = make([]int, len(msgs))
	b.byPartition = map[int32][]int{}
	last := map[string]int{}
	for i, msg := range msgs {
		b.prevSameKey[i] = -1
		if b.decided[i] {
			continue
		}
		if p, ok := last[b.keys[i]]; ok {
			b.prevSameKey[i] = p
		}
		last[b.keys[i]] = i
		if _, ok := b.byPartition[msg.Partition]; !ok {
			b.partitions = append(b.partitions, msg.Partition)
		}
		b.byPartition[msg.Partition] = append(b.byPartition[msg.Partition], i)
	}
	b.loop()
	return b.outs
}

// batch is one ProcessBatch call's state. Only loop's goroutine reads or
// writes it; the goroutines it starts report back through events.
type batch struct {
	c       *Consumer
	ctx     context.Context
	msgs    []Message
	handler MessageHandler
	opts    BatchOptions
	exec    executeOptions
	// outs and decided: each message's outcome, once it has one.
	outs      []Outcome
	decided   []bool
	undecided int
	// active: in flight (being claimed, running, being completed).
	active   []bool
	inFlight int
	keys     []string
	// blocked: PerPartition partitions with a Retry outcome, whose later
	// messages must not run before it.
	blocked map[int32]bool
	// activeKeys: how many in-flight messages have each key (0 or 1).
	activeKeys map[string]int
	// prevSameKey: the poll's previous message with the same key, or -1.
	prevSameKey []int
	// lo: every message before it is decided (pick starts there).
	lo int
	// partitions in order of first appearance, and each one's undecided
	// messages in poll order (PerPartition).
	partitions  []int32
	byPartition map[int32][]int
	// fallback: the server has no ClaimBatch; messages go through
	// ProcessMessage.
	fallback bool
	// events: what the goroutines report, run on loop's goroutine.
	events chan func()
	// running: handlers started and not yet returned; claiming, completing:
	// ClaimBatch and CompleteBatch calls under way; finished: successes
	// waiting for a CompleteBatch.
	running, claiming, completing int
	finished                      []*ran
}

func (b *batch) decide(i int, out Outcome) {
	if !b.decided[i] {
		b.undecided--
	}
	b.outs[i] = out
	b.decided[i] = true
	if b.active[i] {
		b.active[i] = false
		b.inFlight--
		if b.activeKeys[b.keys[i]]--; b.activeKeys[b.keys[i]] == 0 {
			delete(b.activeKeys, b.keys[i])
		}
	}
	if out.Action == Retry && b.opts.Ordering == PerPartition {
		b.blocked[b.msgs[i].Partition] = true
	}
}

// loop starts claims for free slots and CompleteBatch calls for finished
// handlers, and applies what comes back, until every message is decided.
func (b *batch) loop() {
	b.undecided = 0
	for i := range b.msgs {
		if !b.decided[i] {
			b.undecided++
		}
	}
	// Claims wait for a few free slots rather than one, so that they ride
	// in batches; completions likewise, unless no handler is left to finish.
	chunk := max(1, b.opts.Parallelism/8)
	for b.undecided > 0 {
		if free := b.opts.Parallelism - b.inFlight; free >= chunk || (free > 0 && b.claiming == 0 && b.running == 0) {
			if next := b.pick(free); len(next) > 0 {
				b.start(next)
			}
		}
		// Finished successes wait only while a CompleteBatch is under way
		// (they then ride in the next), never behind a slow handler: their
		// leases are no longer extended (as for ExecuteOnce's Complete).
		// They go before that call returns once they are an eighth of what
		// is in flight (at most a chunk), so that a few partitions side by
		// side do not wait for each other. (Java's helper, which also sent
		// them whenever no handler ran, sent a CompleteBatch per message
		// with 0 ms handlers.)
		if len(b.finished) > 0 && (b.completing == 0 || len(b.finished) >= max(1, min(chunk, b.inFlight/8))) {
			b.complete(b.finished)
			b.finished = nil
		}
		if b.inFlight == 0 {
			// Unreachable (pick always finds the first undecided message of
			// a key), but never return a message without an outcome.
			for i := range b.msgs {
				if !b.decided[i] {
					b.decide(i, Outcome{Action: Retry, Reason: "idemd: ProcessBatch could not start this message"})
				}
			}
			return
		}
		(<-b.events)()
		// Apply whatever else has come back before deciding what to send:
		// a claim's handlers finish together, and their successes then
		// ride in one CompleteBatch.
		for drained := false; !drained; {
			select {
			case event := <-b.events:
				event()
			default:
				drained = true
			}
		}
	}
}

// pick chooses up to limit messages to start, in poll order: undecided, not
// in flight, no message with its key in flight or undecided before it, and
// with PerPartition the first undecided message of its partition. It costs
// about what it skips over (in-flight messages), not the whole poll.
func (b *batch) pick(limit int) []int {
	eligible := func(i int) bool {
		if b.decided[i] || b.active[i] || b.activeKeys[b.keys[i]] > 0 {
			return false
		}
		p := b.prevSameKey[i]
		return p < 0 || b.decided[p]
	}
	var next []int
	if b.opts.Ordering == PerPartition {
		for _, p := range b.partitions {
			queue := b.byPartition[p]
			for len(queue) > 0 && b.decided[queue[0]] {
				queue = queue[1:]
			}
			if b.blocked[p] {
				for _, i := range queue {
					b.decide(i, Outcome{Action: Retry, Reason: "an earlier message of its partition must be retried first"})
				}
				queue = nil
			}
			b.byPartition[p] = queue
			if len(queue) > 0 && len(next) < limit && eligible(queue[0]) {
				next = append(next, queue[0])
			}
		}
		return next
	}
	for b.lo < len(b.msgs) && b.decided[b.lo] {
		b.lo++
	}
	for i := b.lo; i < len(b.msgs) && len(next) < limit; i++ {
		if eligible(i) {
			next = append(next, i)
			b.activeKeys[b.keys[i]]++ // so that a later message of the key waits
		}
	}
	for _, i := range next {
		b.activeKeys[b.keys[i]]--
	}
	return next
}

// start claims next's keys in one ClaimBatch (several past the server's
// limit); each claimed handler starts as the answer arrives.
func (b *batch) start(next []int) {
	for _, i := range next {
		b.active[i] = true
		b.activeKeys[b.keys[i]]++
	}
	b.inFlight += len(next)
	if b.fallback {
		for _, i := range next {
			b.answerAsync(i, func() Outcome { return b.c.ProcessMessage(b.ctx, b.msgs[i], b.handler) })
		}
		return
	}
	claims := make([]*idemdv1.ClaimRequest, len(next))
	for n, i := range next {
		claims[n] = b.claimRequest(i)
	}
	b.claiming++
	go func() {
		results, errs := b.claimBatch(claims)
		// The handlers start here, not on loop's goroutine: nothing may come
		// between a granted claim and its handler (the crash bound).
		started := 0
		for n, i := range next {
			if claimed := results[n].GetResponse().GetClaimed(); errs[n] == nil && claimed != nil {
				claims[n].Endpoint = b.c.endpoint
				started++
				go func() {
					end := b.runOne(b.msgs[i], claims[n], claimed)
					b.events <- func() { b.handlerDone(i, end) }
				}()
			}
		}
		b.events <- func() {
			b.claiming--
			b.running += started
			for n, i := range next {
				switch err := errs[n]; {
				case status.Code(err) == codes.Unimplemented:
					b.fallback = true
					b.answerAsync(i, func() Outcome { return b.c.ProcessMessage(b.ctx, b.msgs[i], b.handler) })
				case err != nil:
					b.decide(i, Outcome{Action: Retry, Reason: "idemd call failed: " + status.Code(err).String(), Err: err})
				case results[n].GetResponse().GetClaimed() == nil:
					result := results[n]
					b.answerAsync(i, func() Outcome { return b.answer(i, result) })
				}
			}
		}
	}()
}

// answerAsync decides message i with what out returns, computed on its own
// goroutine (it may call idemd, wait for another holder or the hook).
func (b *batch) answerAsync(i int, out func() Outcome) {
	go func() {
		o := out()
		b.events <- func() { b.decide(i, o) }
	}()
}

// handlerDone takes a handler's end: a success waits for the next
// CompleteBatch; a failure is recorded (Fail) and dead-lettered.
func (b *batch) handlerDone(i int, end *ran) {
	b.running--
	end.index = i
	if end.panicked == nil && end.handlerErr == nil {
		b.finished = append(b.finished, end)
		return
	}
	b.answerAsync(i, func() Outcome {
		if end.panicked != nil {
			reason := panicReason(end.panicked)
			_ = b.c.client.fail(context.WithoutCancel(b.ctx), end.held, end.claim, end.token,
				idemdv1.Disposition_DISPOSITION_UNKNOWN, reason, &b.exec)
			return b.c.deadLettered(b.ctx, b.msgs[i], reason, fmt.Errorf("idemd: handler panicked: %v", end.panicked))
		}
		disposition := idemdv1.Disposition_DISPOSITION_UNKNOWN
		if IsNoSideEffect(end.handlerErr) {
			disposition = idemdv1.Disposition_DISPOSITION_RELEASE
		}
		err := end.handlerErr
		if ferr := b.c.client.fail(context.WithoutCancel(b.ctx), end.held, end.claim, end.token, disposition,
			end.handlerErr.Error(), &b.exec); ferr != nil {
			err = errors.Join(err, fmt.Errorf("idemd: recording the failure: %w", ferr))
		}
		return b.c.deadLettered(b.ctx, b.msgs[i], end.handlerErr.Error(), err)
	})
}

// complete records finished successes with CompleteBatch, then decides
// them: Executed, or as ProcessMessage decides a Complete that failed.
func (b *batch) complete(finished []*ran) {
	b.completing++
	go func() {
		errs := b.completeBatch(finished)
		outs := make([]Outcome, len(finished))
		for n, end := range finished {
			if errs[n] == nil {
				outs[n] = Outcome{Action: Executed}
				continue
			}
			outs[n] = b.c.classify(b.ctx, b.msgs[end.index], true, nil, &CompleteError{Response: messageStored, Err: errs[n]})
		}
		b.events <- func() {
			b.completing--
			for n, end := range finished {
				b.decide(end.index, outs[n])
			}
		}
	}()
}

// claimRequest is what ProcessMessage would claim for message i, with the
// fingerprint computed here (the same fingerprint v1 the server computes;
// the vectors pin it): a claim is then about 100 bytes whatever the
// message's size, so 500 of them stay far below the server's 5 MiB message
// cap, and a value over the server's 1 MiB body limit is claimed as
// ExecuteOnce claims it.
func (b *batch) claimRequest(i int) *idemdv1.ClaimRequest {
	req := HTTPRequest{Method: "CONSUME", Path: b.c.endpoint, Body: b.msgs[i].Value}
	claim := &idemdv1.ClaimRequest{Key: b.keys[i], AttemptId: newAttemptID()}
	if digest, err := Fingerprint(req); err == nil {
		claim.Fingerprint = &idemdv1.ClaimRequest_Sha256{Sha256: digest[:]}
	} else {
		// Unreachable without a JSON content type; the server then says why.
		claim.Fingerprint = &idemdv1.ClaimRequest_Request{Request: req.proto()}
	}
	if b.exec.lease > 0 {
		claim.Lease = durationpb.New(b.exec.lease)
	}
	if b.exec.ttl > 0 {
		claim.Ttl = durationpb.New(b.exec.ttl)
	}
	return claim
}

// claimBatch sends claims in chunks of the server's limit, side by side,
// and returns each claim's result or, when its chunk's call failed, that
// call's error: a chunk that failed never decides the others, whose keys
// may be claimed already. A transport error is retried like a single
// Claim's.
func (b *batch) claimBatch(claims []*idemdv1.ClaimRequest) ([]*idemdv1.ClaimBatchResult, []error) {
	results := make([]*idemdv1.ClaimBatchResult, len(claims))
	errs := make([]error, len(claims))
	var wg sync.WaitGroup
	for lo := 0; lo < len(claims); lo += maxBatchItems {
		hi := min(lo+maxBatchItems, len(claims))
		wg.Go(func() {
			var resp *idemdv1.ClaimBatchResponse
			err := b.retryTransport(func(ctx context.Context) (err error) {
				resp, err = b.c.client.ClaimBatch(ctx, &idemdv1.ClaimBatchRequest{Endpoint: b.c.endpoint, Claims: claims[lo:hi]})
				return err
			})
			if err == nil && len(resp.GetResults()) != hi-lo {
				err = status.Errorf(codes.Internal, "idemd: ClaimBatch answered %d results for %d claims", len(resp.GetResults()), hi-lo)
			}
			if err == nil {
				copy(results[lo:hi], resp.GetResults())
				return
			}
			for k := lo; k < hi; k++ {
				errs[k] = err
			}
		})
	}
	wg.Wait()
	return results, errs
}

// retryTransport retries call after transport errors, as often as a single
// call would be (WithTransportRetries), with backoff.
func (b *batch) retryTransport(call func(context.Context) error) error {
	backoff := initialBackoff
	for failures := 0; ; failures++ {
		err := call(b.ctx)
		if err == nil || !isTransient(err) || failures >= b.exec.transportRetries {
			return err
		}
		if err := sleep(b.ctx, fullJitter(backoff)); err != nil {
			return err
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// ran is a claimed handler's end: what to record.
type ran struct {
	// index: the message's place in the poll.
	index      int
	claim      *idemdv1.ClaimRequest
	token      string
	held       *leaseEnd
	handlerErr error
	panicked   any
}

// runOne runs one claimed message's handler with its lease kept alive
// (keepLease, as ExecuteOnce does), catching a panic.
func (b *batch) runOne(msg Message, claim *idemdv1.ClaimRequest, claimed *idemdv1.Claimed) *ran {
	end := &ran{claim: claim, token: claimed.GetLeaseToken(), held: new(leaseEnd)}
	if claimed.GetAttempt() > 1 {
		// As ProcessMessage: an earlier consumer's lease expired mid-handler.
		end.handlerErr = errTakenOver
		return end
	}
	lease := b.exec.lease
	if lease <= 0 {
		lease = time.Until(claimed.GetLeaseExpiresAt().AsTime())
	}
	ctx, cancel := context.WithCancelCause(b.ctx)
	defer cancel(nil)
	end.held.set(time.Now().Add(lease))
	stop := b.c.client.keepLease(ctx, cancel, claim, end.token, lease, end.held, &b.exec)
	ex := Execution{Endpoint: claim.GetEndpoint(), Key: claim.GetKey(), Attempt: claimed.GetAttempt()}
	func() {
		defer func() {
			if r := recover(); r != nil {
				end.panicked = r
			}
		}()
		end.handlerErr = b.handler(ctx, msg, ex)
	}()
	stop()
	return end
}

// answer is message i's outcome for a claim item that did not grant the
// key: as ProcessMessage's, which the in-progress case defers to (it waits
// for the other holder, up to WithMaxWait).
func (b *batch) answer(i int, result *idemdv1.ClaimBatchResult) Outcome {
	msg := b.msgs[i]
	if ierr := result.GetError(); ierr != nil {
		err := itemStatus(ierr)
		return b.c.classify(b.ctx, msg, false, nil, err)
	}
	resp := result.GetResponse()
	switch {
	case resp.GetReplayed() != nil:
		return Outcome{Action: Duplicate}
	case resp.GetInProgress() != nil:
		return b.c.ProcessMessage(b.ctx, msg, b.handler)
	case resp.GetMismatch() != nil:
		return b.c.classify(b.ctx, msg, false, nil, &KeyReuseError{ErrorCode: resp.GetErrorCode()})
	case resp.GetPending() != nil:
		p := resp.GetPending()
		return b.c.classify(b.ctx, msg, false, nil, &OutcomePendingError{State: p.GetState(), Reason: p.GetReason()})
	}
	return Outcome{Action: Retry, Reason: "idemd answered a claim with no outcome"}
}

// completeBatch completes finished in chunks of the server's limit, side
// by side, and returns each item's error. A whole-call transport error is
// retried while the leases hold (a Complete is safe to repeat); an item
// refused for another reason is marked unknown (Fail) so that it is pending
// now, not at lease expiry, as ExecuteOnce does.
func (b *batch) completeBatch(finished []*ran) []error {
	errs := make([]error, len(finished))
	var wg sync.WaitGroup
	for lo := 0; lo < len(finished); lo += maxBatchItems {
		hi := min(lo+maxBatchItems, len(finished))
		wg.Go(func() {
			req := &idemdv1.CompleteBatchRequest{Endpoint: b.c.endpoint}
			for _, end := range finished[lo:hi] {
				req.Completions = append(req.Completions, &idemdv1.CompleteRequest{
					Key: end.claim.GetKey(), LeaseToken: end.token, Response: messageStored.proto()})
			}
			var resp *idemdv1.CompleteBatchResponse
			err := b.c.client.retryRecord(context.WithoutCancel(b.ctx), &b.exec, finished[lo].held,
				func(ctx context.Context) (err error) {
					resp, err = b.c.client.CompleteBatch(ctx, req)
					return err
				})
			if err == nil && len(resp.GetResults()) != hi-lo {
				err = status.Errorf(codes.Internal, "idemd: CompleteBatch answered %d results for %d items", len(resp.GetResults()), hi-lo)
			}
			for k := lo; k < hi; k++ {
				if err != nil {
					errs[k] = err
				} else if ierr := resp.GetResults()[k-lo].GetError(); ierr != nil {
					errs[k] = itemStatus(ierr)
				}
				if errs[k] == nil {
					continue
				}
				switch status.Code(errs[k]) {
				case codes.FailedPrecondition, codes.NotFound:
					// Fenced out or decided: nothing left to record.
				default:
					end := finished[k]
					_ = b.c.client.fail(context.WithoutCancel(b.ctx), end.held, end.claim, end.token,
						idemdv1.Disposition_DISPOSITION_UNKNOWN,
						"the handler's response could not be stored: "+status.Code(errs[k]).String(), &b.exec)
				}
			}
		})
	}
	wg.Wait()
	return errs
}

// itemStatus is a batch item's error as the status error the single RPC
// would have returned, details included (errdetails, errors.As work on it).
func itemStatus(e *idemdv1.ItemError) error {
	if len(e.GetStatusDetails()) > 0 {
		var s spb.Status
		if err := proto.Unmarshal(e.GetStatusDetails(), &s); err == nil && s.GetCode() == e.GetCode() {
			return status.ErrorProto(&s)
		}
	}
	return status.Error(codes.Code(e.GetCode()), e.GetMessage())
}
