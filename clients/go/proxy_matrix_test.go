package idemd_test

// The proxy matrix (clients/conformance/proxy-matrix.md, issue 51): the SDK's
// default transport, grpc-go, calling idemd through a real nginx
// (scripts/nginx.sh) in every profile, executor and raw runs, every key
// checked afterwards by a direct Lookup. test.sh runs it on its own with -v so
// that its "proxy-matrix:" lines are in every run's log.

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	idemd "github.com/idemd/idemd/clients/go"
	idemdv1 "github.com/idemd/idemd/clients/go/gen/idemd/v1"
	"github.com/idemd/idemd/clients/go/internal/testserver"
)

const (
	matrixEndpoint  = "POST /v1/proxy-matrix"
	matrixLease     = 10 * time.Second
	matrixRunLimit  = 120 * time.Second // a run past it counts its unfinished calls as hangs
	matrixInFlight  = 32
	matrixTransport = "grpc-go"
)

var matrixRequest = idemd.HTTPRequest{Method: "POST", Path: "/v1/proxy-matrix", ContentType: "application/json",
	Body: []byte(`{"matrix":true}`)}

// matrixProfiles are scripts/nginx.sh's profiles, in its order.
var matrixProfiles = []string{"h2c", "tls", "goaway", "streams4", "idle1s"}

// nginx is one scripts/nginx.sh proxy.
type nginx struct {
	dir, addr string
}

func nginxScript() string { return filepath.Join(testserver.RepoRoot(), "scripts", "nginx.sh") }

// startNginx starts nginx with profile in front of upstream; stopped at the
// end of the test.
func startNginx(t *testing.T, upstream, profile, certs string) *nginx {
	t.Helper()
	dir := t.TempDir()
	args := []string{nginxScript(), "start", "--dir", dir, "--upstream", upstream, "--profile", profile}
	if certs != "" {
		args = append(args, "--certs", certs)
	}
	out, err := exec.Command("bash", args...).Output()
	if err != nil {
		var stderr []byte
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			stderr = exit.Stderr
		}
		t.Fatalf("scripts/nginx.sh start --profile %s: %v\n%s", profile, err, stderr)
	}
	n := &nginx{dir: dir, addr: strings.TrimSpace(string(out))}
	t.Cleanup(func() { _ = exec.Command("bash", nginxScript(), "stop", "--dir", dir).Run() })
	return n
}

// count is `scripts/nginx.sh count`: the error log's lines containing what.
func (n *nginx) count(what string) int {
	out, _ := exec.Command("bash", nginxScript(), "count", "--dir", n.dir, what).Output()
	v, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return v
}

// stats is what nginx logged that shows a run met its limit: the refused
// streams (nginx 1.22 logs no line for the GOAWAYs of keepalive_requests or
// keepalive_timeout at info: the client's connection count shows those).
func (n *nginx) stats() string {
	return fmt.Sprintf("nginx: %d concurrent streams exceeded", n.count("concurrent streams exceeded"))
}

// connCounter counts the HTTP/2 connections grpc-go opened: after the first,
// each one followed a GOAWAY or a close.
type connCounter struct{ n atomic.Int64 }

func (c *connCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (c *connCounter) HandleRPC(context.Context, stats.RPCStats)                       {}
func (c *connCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (c *connCounter) HandleConn(_ context.Context, s stats.ConnStats) {
	if _, ok := s.(*stats.ConnBegin); ok {
		c.n.Add(1)
	}
}

// matrixLine is the line proxy-matrix.md asks for.
func matrixLine(profile, run string, calls, errs, violations int, took time.Duration, extra string) string {
	line := fmt.Sprintf("proxy-matrix: go %s %s %s: %d calls, %d errors, %d violations, %.1f s",
		matrixTransport, profile, run, calls, errs, violations, took.Seconds())
	if extra != "" {
		line += " (" + extra + ")"
	}
	return line
}

// matrixLookup is a direct Lookup (no proxy): the state name without
// "STATE_", "ABSENT" for NOT_FOUND, and the stored body when COMPLETED.
type matrixLookup func(ctx context.Context, key string) (state string, body []byte, err error)

func directLookup(c *idemd.Client) matrixLookup {
	return func(ctx context.Context, key string) (string, []byte, error) {
		resp, err := c.Lookup(ctx, &idemdv1.LookupRequest{Endpoint: matrixEndpoint, Key: key, IncludeResponse: true})
		if status.Code(err) == codes.NotFound {
			return "ABSENT", nil, nil
		}
		if err != nil {
			return "", nil, err
		}
		rec := resp.GetRecord()
		return strings.TrimPrefix(rec.GetState().String(), "STATE_"), rec.GetResponse().GetBody(), nil
	}
}

func matrixBody(key string) []byte { return []byte(`{"key":"` + key + `"}`) }

// executorOutcome is one ExecuteOnce of an executor run.
type executorOutcome struct {
	key      string
	err      error
	hung     bool
	replayed bool
	body     []byte
}

// checkExecutorRun holds an executor run to proxy-matrix.md: no error, no
// hang, the handler called exactly once per key (not at all on replays),
// every key COMPLETED with the handler's response. It returns the problems.
func checkExecutorRun(ctx context.Context, outcomes []executorOutcome, calls map[string]int, replays bool,
	lookup matrixLookup) (errs int, violations []string) {
	for _, o := range outcomes {
		want := matrixBody(o.key)
		switch {
		case o.hung:
			errs++
			violations = append(violations, o.key+": hung past the run's deadline")
		case o.err != nil:
			errs++
			violations = append(violations, fmt.Sprintf("%s: %v", o.key, o.err))
		case o.replayed != replays:
			violations = append(violations, fmt.Sprintf("%s: replayed %v, want %v", o.key, o.replayed, replays))
		case string(o.body) != string(want):
			violations = append(violations, fmt.Sprintf("%s: response %q, want %q", o.key, o.body, want))
		}
		wantCalls := 1
		if calls[o.key] != wantCalls {
			violations = append(violations, fmt.Sprintf("%s: handler called %d times", o.key, calls[o.key]))
		}
		state, body, err := lookup(ctx, o.key)
		switch {
		case err != nil:
			violations = append(violations, fmt.Sprintf("%s: direct Lookup: %v", o.key, err))
		case state != "COMPLETED":
			violations = append(violations, fmt.Sprintf("%s: left %s", o.key, state))
		case string(body) != string(want):
			violations = append(violations, fmt.Sprintf("%s: stored %q, want %q", o.key, body, want))
		}
	}
	return errs, violations
}

// rawOutcome is one key of a raw run: a Claim, then a Complete, no retry.
type rawOutcome struct {
	key   string
	stage string // "" (both succeeded), "claim" or "complete": the call that failed
	err   error
}

// checkRawRun holds a raw run to proxy-matrix.md: an error on a request idemd
// never received (a failed Claim whose key is absent, a failed Complete whose
// key is still IN_PROGRESS) is a violation, and so is an error on one it did
// receive other than UNAVAILABLE / DEADLINE_EXCEEDED. A key without error must
// be COMPLETED. received counts the allowed errors (outcome unknown).
func checkRawRun(ctx context.Context, outcomes []rawOutcome, lookup matrixLookup) (errs, received int, violations []string) {
	for _, o := range outcomes {
		state, body, err := lookup(ctx, o.key)
		if err != nil {
			violations = append(violations, fmt.Sprintf("%s: direct Lookup: %v", o.key, err))
			continue
		}
		if o.stage == "" {
			if state != "COMPLETED" || string(body) != string(matrixBody(o.key)) {
				violations = append(violations, fmt.Sprintf("%s: completed without error but %s", o.key, state))
			}
			continue
		}
		errs++
		code := status.Code(o.err)
		neverReceived := (o.stage == "claim" && state == "ABSENT") || (o.stage == "complete" && state == "IN_PROGRESS")
		switch {
		case neverReceived:
			violations = append(violations, fmt.Sprintf("%s: %s failed (%s: %s) although idemd never received it (key %s)",
				o.key, o.stage, code, status.Convert(o.err).Message(), state))
		case code != codes.Unavailable && code != codes.DeadlineExceeded:
			violations = append(violations, fmt.Sprintf("%s: %s failed with %s (key %s)", o.key, o.stage, code, state))
		default:
			received++
		}
	}
	return errs, received, violations
}

// matrixKeys are n fresh keys.
func matrixKeys(t *testing.T, run string, n int) []string {
	prefix := "pm-go-" + randomPrefix(t) + "-" + run + "-"
	keys := make([]string, n)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
	}
	return keys
}

// handlerCalls counts the handler's calls per key.
type handlerCalls struct {
	mu    sync.Mutex
	calls map[string]int
}

func (h *handlerCalls) handler(ctx context.Context, ex idemd.Execution) (*idemd.Response, error) {
	h.mu.Lock()
	if h.calls == nil {
		h.calls = map[string]int{}
	}
	h.calls[ex.Key]++
	h.mu.Unlock()
	return &idemd.Response{Status: 201, Body: matrixBody(ex.Key)}, nil
}

func (h *handlerCalls) snapshot() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]int, len(h.calls))
	for k, v := range h.calls {
		out[k] = v
	}
	return out
}

// forEach runs f for every key with at most inFlight at a time, under a
// deadline: keys whose call has not returned by then are reported as hung.
func forEach(keys []string, inFlight int, pause func(i int), f func(ctx context.Context, i int, key string)) (hung []int) {
	ctx, cancel := context.WithTimeout(context.Background(), matrixRunLimit)
	defer cancel()
	done := make([]atomic.Bool, len(keys))
	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < inFlight; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(ctx, i, keys[i])
				done[i].Store(true)
			}
		}()
	}
	finished := make(chan struct{})
	go func() {
		defer close(next)
		for i := range keys {
			if pause != nil {
				pause(i)
			}
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-ctx.Done():
		// Give the calls in flight a moment to see the cancelled context.
		select {
		case <-finished:
		case <-time.After(5 * time.Second):
		}
	}
	for i := range keys {
		if !done[i].Load() {
			hung = append(hung, i)
		}
	}
	return hung
}

// matrixRunner runs the four runs of one profile.
type matrixRunner struct {
	t       *testing.T
	profile string
	proxied *idemd.Client // through nginx
	lookup  matrixLookup  // direct
	proxy   *nginx
	conns   *connCounter
	// pause, when set, runs before every key's call is handed out (idle1s:
	// let a connection go idle for about as long as nginx keeps it).
	pause func(i int)
}

// stats: nginx's refusals so far, the client's connections so far.
func (r *matrixRunner) stats() string {
	return fmt.Sprintf("%s; grpc-go opened %d connections", r.proxy.stats(), r.conns.n.Load())
}

func (r *matrixRunner) report(run string, calls, errs int, violations []string, took time.Duration) {
	extra := r.stats()
	fmt.Println(matrixLine(r.profile, run, calls, errs, len(violations), took, extra))
	for i, v := range violations {
		if i == 20 {
			r.t.Errorf("%s %s: ... and %d more violations", r.profile, run, len(violations)-i)
			break
		}
		r.t.Errorf("%s %s: %s", r.profile, run, v)
	}
}

// executorRun calls ExecuteOnce for every key, inFlight at a time, and checks
// the run.
func (r *matrixRunner) executorRun(run string, keys []string, inFlight int, replays bool) {
	var h handlerCalls
	outcomes := make([]executorOutcome, len(keys))
	start := time.Now()
	hung := forEach(keys, inFlight, r.pause, func(ctx context.Context, i int, key string) {
		res, err := r.proxied.ExecuteOnce(ctx, matrixEndpoint, key, matrixRequest, h.handler, idemd.WithLease(matrixLease))
		o := executorOutcome{key: key, err: err}
		if err == nil {
			o.replayed, o.body = res.Replayed, res.Response.Body
		}
		outcomes[i] = o
	})
	took := time.Since(start)
	for _, i := range hung {
		outcomes[i] = executorOutcome{key: keys[i], hung: true}
	}
	calls := h.snapshot()
	if replays {
		// The handler must not run on a replay: the first run called it once.
		for _, k := range keys {
			calls[k]++
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs, violations := checkExecutorRun(ctx, outcomes, calls, replays, r.lookup)
	r.report(run, len(keys), errs, violations, took)
}

// rawRun claims and completes every key with raw calls, no retry.
func (r *matrixRunner) rawRun(keys []string) {
	start := time.Now()
	outcomes := rawCalls(r.proxied, keys, r.pause)
	took := time.Since(start)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs, received, violations := checkRawRun(ctx, outcomes, r.lookup)
	extra := fmt.Sprintf("%d errors on requests idemd received, %s", received, r.stats())
	fmt.Println(matrixLine(r.profile, "raw", len(keys), errs, len(violations), took, extra))
	for i, v := range violations {
		if i == 20 {
			r.t.Errorf("%s raw: ... and %d more violations", r.profile, len(violations)-i)
			break
		}
		r.t.Errorf("%s raw: %s", r.profile, v)
	}
}

// rawCalls is a raw run's calls: Claim then Complete per key, 32 keys in
// flight, every error recorded as the SDK surfaced it.
func rawCalls(c *idemd.Client, keys []string, pause func(int)) []rawOutcome {
	outcomes := make([]rawOutcome, len(keys))
	hung := forEach(keys, matrixInFlight, pause, func(ctx context.Context, i int, key string) {
		o := rawOutcome{key: key}
		resp, err := c.Claim(ctx, &idemdv1.ClaimRequest{
			Endpoint: matrixEndpoint, Key: key, AttemptId: "raw-" + key, Lease: durationpb.New(matrixLease),
			Fingerprint: &idemdv1.ClaimRequest_Request{Request: &idemdv1.HttpRequest{
				Method: matrixRequest.Method, Path: matrixRequest.Path, ContentType: matrixRequest.ContentType,
				Body: matrixRequest.Body}},
		})
		switch {
		case err != nil:
			o.stage, o.err = "claim", err
		case resp.GetClaimed() == nil:
			o.stage, o.err = "claim", status.Errorf(codes.Internal, "claim answered %T, not claimed", resp.GetOutcome())
		default:
			_, err = c.Complete(ctx, &idemdv1.CompleteRequest{Endpoint: matrixEndpoint, Key: key,
				LeaseToken: resp.GetClaimed().GetLeaseToken(),
				Response:   &idemdv1.StoredResponse{Status: 201, Body: matrixBody(key)}})
			if err != nil {
				o.stage, o.err = "complete", err
			}
		}
		outcomes[i] = o
	})
	for _, i := range hung {
		outcomes[i] = rawOutcome{key: keys[i], stage: "claim", err: status.Error(codes.DeadlineExceeded, "hung")}
	}
	return outcomes
}

// TestProxyMatrix is proxy-matrix.md for grpc-go.
func TestProxyMatrix(t *testing.T) {
	certs, err := testserver.TestCerts()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := testserver.Start()
	if err != nil {
		t.Fatalf("starting idemd: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Error(err)
		}
	})
	token := credential(t, "alice")
	direct, err := idemd.New(srv.Addr, idemd.WithToken(token), idemd.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()

	for _, profile := range matrixProfiles {
		t.Run(profile, func(t *testing.T) {
			proxy := startNginx(t, srv.Addr, profile, certs)
			conns := new(connCounter)
			target, opts := proxy.addr, []idemd.Option{idemd.WithToken(token),
				idemd.WithDialOptions(grpc.WithStatsHandler(conns))}
			switch profile {
			case "tls", "goaway":
				// server.crt names localhost.
				target = strings.Replace(target, "127.0.0.1", "localhost", 1)
				opts = append(opts, idemd.WithCAFile(filepath.Join(certs, "ca.pem")))
			default:
				opts = append(opts, idemd.WithInsecure())
			}
			proxied, err := idemd.New(target, opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer proxied.Close()
			r := &matrixRunner{t: t, profile: profile, proxied: proxied, lookup: directLookup(direct), proxy: proxy,
				conns: conns}
			if profile == "idle1s" {
				// Every 50th call waits about as long as nginx keeps an idle
				// connection (it closes one idle for 1.00 s): 980 to 1,120 ms,
				// so that calls land on either side of the close, and some
				// race it. (The pause starts when the previous call is handed
				// out, so the idle time is a few ms shorter.)
				r.pause = func(i int) {
					if i > 0 && i%50 == 0 {
						time.Sleep(980*time.Millisecond + time.Duration((i/50)%8)*20*time.Millisecond)
					}
				}
			}
			sequential := matrixKeys(t, "seq", 300)
			r.executorRun("executor-sequential", sequential, 1, false)
			r.executorRun("executor-concurrent", matrixKeys(t, "conc", 600), matrixInFlight, false)
			r.executorRun("replays", sequential[:100], 1, true)
			r.rawRun(matrixKeys(t, "raw", 300))
			if profile == "h2c" {
				r.executorRun("executor-300-in-flight", matrixKeys(t, "300", 300), 300, false)
			}
		})
	}
}

// TestProxyMatrixCheckFailsOnALostRequest is the matrix's negative control: a
// transport that surfaces an error for a request it never sent (as one that
// turns a GOAWAY into an error does) must be caught by the raw run's check,
// and so must an executor run with an error, a double or a key left behind.
func TestProxyMatrixCheckFailsOnALostRequest(t *testing.T) {
	t.Parallel()
	srv := testserver.Shared(t)
	token := credential(t, "alice")
	direct := newClient(t)
	// Every 7th Claim and every 11th Complete "refused before being sent".
	var claims, completes atomic.Int32
	var lost atomic.Int32
	dropping := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		n := int32(0)
		switch {
		case strings.HasSuffix(method, "/Claim"):
			n = claims.Add(1) % 7
		case strings.HasSuffix(method, "/Complete"):
			n = completes.Add(1) % 11
		default:
			n = 1
		}
		if n == 0 {
			lost.Add(1)
			return status.Error(codes.Unavailable, "synthetic: GOAWAY before the call was taken")
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	broken, err := idemd.New(srv.Addr, idemd.WithToken(token), idemd.WithInsecure(),
		idemd.WithDialOptions(grpc.WithChainUnaryInterceptor(dropping)))
	if err != nil {
		t.Fatal(err)
	}
	defer broken.Close()
	ctx := context.Background()
	outcomes := rawCalls(broken, matrixKeys(t, "neg", 100), nil)
	errs, received, violations := checkRawRun(ctx, outcomes, directLookup(direct))
	if want := int(lost.Load()); want == 0 || errs != want || len(violations) != want || received != 0 {
		t.Fatalf("raw check: %d errors, %d violations, %d received, want %d lost requests each a violation:\n%s",
			errs, len(violations), received, want, strings.Join(violations, "\n"))
	}
	// The unbroken client on the same keys' neighbours: no violation.
	clean := rawCalls(direct, matrixKeys(t, "pos", 50), nil)
	if errs, _, violations := checkRawRun(ctx, clean, directLookup(direct)); errs != 0 || len(violations) != 0 {
		t.Fatalf("raw check of a clean run: %d errors, violations %v", errs, violations)
	}

	// The executor check: an error, a double, a key never completed.
	keys := matrixKeys(t, "negx", 3)
	var h handlerCalls
	for _, k := range keys[:2] {
		if _, err := direct.ExecuteOnce(ctx, matrixEndpoint, k, matrixRequest, h.handler); err != nil {
			t.Fatal(err)
		}
	}
	calls := h.snapshot()
	calls[keys[1]]++ // a double
	outcomes2 := []executorOutcome{
		{key: keys[0], body: matrixBody(keys[0])},
		{key: keys[1], body: matrixBody(keys[1])},
		{key: keys[2], err: errors.New("synthetic: UNAVAILABLE")}, // failed, and absent in idemd
	}
	errs, violations = checkExecutorRun(ctx, outcomes2, calls, false, directLookup(direct))
	if errs != 1 || len(violations) != 4 { // the error, the double, key 2 called 0 times and ABSENT
		t.Fatalf("executor check: %d errors, violations %q; want 1 error, 4 violations", errs, violations)
	}
}

// TestCompleteIsRetriedWithinTheLease: a Complete that cannot be delivered
// (here refused 7 times, more than DefaultTransportRetries) is retried while
// the lease holds, so the key ends COMPLETED and the caller gets its result
// instead of a CompleteError and a key left IN_PROGRESS.
func TestCompleteIsRetriedWithinTheLease(t *testing.T) {
	t.Parallel()
	var completes atomic.Int32
	refusing := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if strings.HasSuffix(method, "/Complete") && completes.Add(1) <= 7 {
			return status.Error(codes.Unavailable, "synthetic: connection closed before the request was written")
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c := newClient(t, idemd.WithDialOptions(grpc.WithChainUnaryInterceptor(refusing)))
	key := newKey(t)
	res, err := c.ExecuteOnce(context.Background(), matrixEndpoint, key, matrixRequest,
		func(context.Context, idemd.Execution) (*idemd.Response, error) { return created(`{"ok":1}`), nil },
		idemd.WithLease(matrixLease))
	if err != nil {
		t.Fatalf("ExecuteOnce: %v (after %d Completes)", err, completes.Load())
	}
	if res.Replayed || completes.Load() != 8 {
		t.Fatalf("replayed %v after %d Completes, want a fresh result after 8", res.Replayed, completes.Load())
	}
	if state := lookupState(t, c, matrixEndpoint, key); state != "COMPLETED" {
		t.Fatalf("key %s, want COMPLETED", state)
	}
}
