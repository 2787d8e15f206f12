package idemd_test

// The HTTP middleware inside real routers (net/http's ServeMux and chi)
// over real HTTP against the live idemd: the shared HTTP scenarios
// (clients/conformance/http-scenarios.json, which idemd proxy's suite runs
// too), and what the middleware hands the handler.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	idemd "github.com/idemd/idemd/clients/go"
	idemdv1 "github.com/idemd/idemd/clients/go/gen/idemd/v1"
	"github.com/idemd/idemd/clients/go/internal/testserver"
)

type httpScenarioFile struct {
	Routes          json.RawMessage `json:"routes"`
	ProxyOnlyFields []string        `json:"proxy_only_fields"`
	Scenarios       []struct {
		Name  string           `json:"name"`
		Only  string           `json:"only"`
		Steps []map[string]any `json:"steps"`
	} `json:"scenarios"`
}

func loadHTTPScenarios(t *testing.T) (*httpScenarioFile, idemd.RoutesConfig) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testserver.ConformanceDir(), "http-scenarios.json"))
	if err != nil {
		t.Fatal(err)
	}
	var file httpScenarioFile
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	routes, err := idemd.ParseRoutes(file.Routes, file.ProxyOnlyFields...)
	if err != nil {
		t.Fatal(err)
	}
	return &file, routes
}

// appState counts the test app's executions per path.
type appState struct {
	mu         sync.Mutex
	executions map[string]int
}

func (s *appState) count(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.executions[path]++
	return s.executions[path]
}

func (s *appState) of(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.executions[path]
}

const slowApp = 600 * time.Millisecond

// crashMessage is the message of the error the app panics with on /crash/
// and /crash-exposed/ (http-scenarios.md): the text a 409 must not show.
const crashMessage = "boom: secret-4711"

// app is the scenarios' app (http-scenarios.md): it panics for /crash/ and
// /crash-exposed/ (an ordinary error) and /norun/ (a NoSideEffect error).
func (s *appState) app(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	path := r.URL.Path
	execution := s.count(path)
	if strings.Contains(path, "/slow/") {
		time.Sleep(slowApp)
	}
	if strings.HasPrefix(path, "/crash/") || strings.HasPrefix(path, "/crash-exposed/") {
		panic(errors.New(crashMessage))
	}
	if strings.HasPrefix(path, "/norun/") {
		panic(idemd.NoSideEffect(errors.New("card rejected before charging")))
	}
	status, payload := 201, []byte(nil)
	switch {
	case strings.Contains(path, "/fail/"):
		status, payload = 500, []byte(`{"error":"boom"}`)
	case strings.HasPrefix(path, "/big/"):
		status, payload = 200, bytes.Repeat([]byte("x"), 65536)
	default:
		payload, _ = json.Marshal(map[string]any{"path": path, "execution": execution, "request_bytes": len(body)})
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Location", path)
	h.Add("Set-Cookie", fmt.Sprintf("session=secret-%d", execution))
	h.Set("X-Execution", fmt.Sprint(execution))
	sum := sha256.Sum256(body)
	h.Set("X-Body-Sha256", hex.EncodeToString(sum[:]))
	if ex, ok := idemd.ExecutionFrom(r.Context()); ok {
		h.Set("X-Downstream-Key", ex.DownstreamKey("charge"))
	}
	w.WriteHeader(status)
	_, _ = w.Write(payload)
}

type reply struct {
	status  int
	headers http.Header
	body    []byte
}

var httpKeyPlaceholder = regexp.MustCompile(`\{key:(\d+)\}`)

func sendStep(url string, request map[string]any, prefix string) (*reply, error) {
	body := ""
	if b, ok := request["body"].(string); ok {
		body = b
	}
	req, err := http.NewRequest(request["method"].(string), url+request["path"].(string), strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	if headers, ok := request["headers"].([]any); ok {
		for _, pair := range headers {
			p := pair.([]any)
			// Set the raw value: Go's client sends it as given.
			req.Header[http.CanonicalHeaderKey(p[0].(string))] = append(req.Header[http.CanonicalHeaderKey(p[0].(string))],
				httpKeyPlaceholder.ReplaceAllString(p[1].(string), prefix+"-$1"))
		}
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	res, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, err
	}
	return &reply{status: res.StatusCode, headers: res.Header, body: data}, nil
}

func number(v any) int { f, _ := v.(float64); return int(f) }

func checkReply(at string, expect map[string]any, r *reply, err error, saved map[string][]byte) error {
	if expect["failed"] == true {
		if err == nil && r.status < 500 {
			return fmt.Errorf("%s: expected a failure, got %d %s", at, r.status, r.body)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: no answer: %v", at, err)
	}
	if s, ok := expect["status"]; ok && number(s) != r.status {
		return fmt.Errorf("%s: status %d, body %.300s", at, r.status, r.body)
	}
	if headers, ok := expect["headers"].(map[string]any); ok {
		for name, want := range headers {
			values := r.headers.Values(name)
			got := any(nil)
			if len(values) > 0 {
				got = values[len(values)-1]
			}
			if got != want {
				return fmt.Errorf("%s: header %s is %v, want %v; %v", at, name, got, want, r.headers)
			}
		}
	}
	if p, ok := expect["problem"].(string); ok {
		if ct := r.headers.Get("Content-Type"); ct != "application/problem+json" {
			return fmt.Errorf("%s: content-type %q", at, ct)
		}
		var problem map[string]any
		if err := json.Unmarshal(r.body, &problem); err != nil || problem["type"] != "https://idemd.dev/problems/"+p {
			return fmt.Errorf("%s: problem %s", at, r.body)
		}
	}
	if expect["retry_after"] == true && r.headers.Get("Retry-After") == "" {
		return fmt.Errorf("%s: Retry-After missing", at)
	}
	if b, ok := expect["body"].(string); ok && string(r.body) != b {
		return fmt.Errorf("%s: body %s", at, r.body)
	}
	if n, ok := expect["body_length"]; ok && number(n) != len(r.body) {
		return fmt.Errorf("%s: body length %d", at, len(r.body))
	}
	if name, ok := expect["body_same_as"].(string); ok && !bytes.Equal(r.body, saved[name]) {
		return fmt.Errorf("%s: body differs from %s's", at, name)
	}
	if parts, ok := expect["body_includes"].([]any); ok {
		for _, part := range parts {
			if !bytes.Contains(r.body, []byte(part.(string))) {
				return fmt.Errorf("%s: body lacks %s: %s", at, part, r.body)
			}
		}
	}
	if parts, ok := expect["body_excludes"].([]any); ok {
		for _, part := range parts {
			if bytes.Contains(r.body, []byte(part.(string))) {
				return fmt.Errorf("%s: body contains %s: %s", at, part, r.body)
			}
		}
	}
	return nil
}

func runHTTPScenarios(t *testing.T, file *httpScenarioFile, url string, executions func(string) int) {
	ran := 0
	for number_, sc := range file.Scenarios {
		if sc.Only != "" && sc.Only != "middleware" {
			continue
		}
		prefix := randomHex(8)
		saved := map[string][]byte{}
		type result struct {
			r   *reply
			err error
		}
		started := map[string]chan result{}
		startedPath := map[string]string{}
		for index, step := range sc.Steps {
			at := fmt.Sprintf("scenario %d (%s), step %d", number_, sc.Name, index)
			expect, _ := step["expect"].(map[string]any)
			request, _ := step["request"].(map[string]any)
			var path string
			if ms, ok := step["sleep_ms"]; ok {
				time.Sleep(time.Duration(number(ms)) * time.Millisecond)
				continue
			} else if name, ok := step["finish"].(string); ok {
				got := <-started[name]
				path = startedPath[name]
				if err := checkReply(at, expect, got.r, got.err, saved); err != nil {
					t.Fatal(err)
				}
			} else if name, ok := step["start"].(string); ok {
				ch := make(chan result, 1)
				started[name] = ch
				startedPath[name] = request["path"].(string)
				go func() { r, err := sendStep(url, request, prefix); ch <- result{r, err} }()
				continue
			} else if n, ok := step["parallel"]; ok {
				path = request["path"].(string)
				results := make([]result, number(n))
				var wg sync.WaitGroup
				for i := range results {
					wg.Add(1)
					go func() { defer wg.Done(); r, err := sendStep(url, request, prefix); results[i] = result{r, err} }()
				}
				wg.Wait()
				statuses := []int{}
				bodies := map[string]bool{}
				for _, res := range results {
					if res.err != nil {
						t.Fatalf("%s: no answer: %v", at, res.err)
					}
					statuses = append(statuses, res.r.status)
					if allowed, ok := expect["statuses"].([]any); ok {
						found := false
						for _, a := range allowed {
							found = found || number(a) == res.r.status
						}
						if !found {
							t.Fatalf("%s: status %d not allowed", at, res.r.status)
						}
					}
					if s, ok := expect["same_body_for"]; ok && number(s) == res.r.status {
						bodies[string(res.r.body)] = true
					}
					if on409, ok := expect["on_409"].(map[string]any); ok && res.r.status == 409 {
						if err := checkReply(at, on409, res.r, nil, nil); err != nil {
							t.Fatal(err)
						}
					}
				}
				if len(bodies) > 1 {
					t.Fatalf("%s: different bodies", at)
				}
				if s, ok := expect["includes_status"]; ok {
					found := false
					for _, st := range statuses {
						found = found || st == number(s)
					}
					if !found {
						t.Fatalf("%s: no %d in %v", at, number(s), statuses)
					}
				}
			} else {
				path = request["path"].(string)
				r, err := sendStep(url, request, prefix)
				if err := checkReply(at, expect, r, err, saved); err != nil {
					t.Fatal(err)
				}
				if name, ok := step["save_as"].(string); ok && r != nil {
					saved[name] = r.body
				}
			}
			if n, ok := expect["executions"]; ok && executions(path) != number(n) {
				t.Fatalf("%s: executions of %s: %d, want %d", at, path, executions(path), number(n))
			}
		}
		ran++
	}
	if ran <= 10 {
		t.Fatalf("only %d scenarios ran", ran)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// routers: the app behind the middleware in net/http's ServeMux and in chi.
var routers = map[string]func(mw func(http.Handler) http.Handler, app http.HandlerFunc) http.Handler{
	"net/http": func(mw func(http.Handler) http.Handler, app http.HandlerFunc) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("/", mw(app))
		return mux
	},
	"chi": func(mw func(http.Handler) http.Handler, app http.HandlerFunc) http.Handler {
		r := chi.NewRouter()
		r.Use(mw)
		r.HandleFunc("/*", app)
		return r
	},
}

func aliceClient(t *testing.T) *idemd.Client {
	srv := testserver.Shared(t)
	c, err := idemd.New(srv.Addr, idemd.WithToken("conformance-token-alice-3f9a"), idemd.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestMiddlewareHTTPScenarios(t *testing.T) {
	file, routes := loadHTTPScenarios(t)
	client := aliceClient(t)
	for name, router := range routers {
		t.Run(name, func(t *testing.T) {
			mw, err := idemd.Middleware(client, routes)
			if err != nil {
				t.Fatal(err)
			}
			state := &appState{executions: map[string]int{}}
			server := httptest.NewServer(router(mw, state.app))
			server.Config.ErrorLog = nil
			defer server.Close()
			runHTTPScenarios(t, file, server.URL, state.of)
		})
	}
}

func TestMiddlewareHandsTheBodyAndExecutionOn(t *testing.T) {
	_, routes := loadHTTPScenarios(t)
	mw, err := idemd.Middleware(aliceClient(t), routes)
	if err != nil {
		t.Fatal(err)
	}
	state := &appState{executions: map[string]int{}}
	server := httptest.NewServer(mw(http.HandlerFunc(state.app)))
	defer server.Close()
	key := randomHex(8)
	body := `{"amount": 4200,  "currency": "usd", "note": "café"}`
	r, err := sendStep(server.URL, map[string]any{"method": "POST", "path": "/v1/payments/b1", "body": body,
		"headers": []any{[]any{"idempotency-key", key}, []any{"content-type", "application/json"}}}, "")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(body))
	if r.status != 201 || r.headers.Get("X-Body-Sha256") != hex.EncodeToString(sum[:]) {
		t.Fatalf("status %d, body hash %s", r.status, r.headers.Get("X-Body-Sha256"))
	}
	if got := r.headers.Get("X-Downstream-Key"); got != idemd.DownstreamKey(key, "charge") {
		t.Fatalf("downstream key %q", got)
	}
}

func TestMiddlewareRefusesBadRoutes(t *testing.T) {
	for _, bad := range []string{`{"routes":[{"path":"v1"}]}`, `{"routes":[{"path":"/a","key":"maybe"}]}`,
		`{"routes":[{"path":"/a","upstream_timeout":"5s"}]}`, `{"routes":[{"path":"/a/*/b"}]}`} {
		routes, err := idemd.ParseRoutes([]byte(bad))
		if err == nil {
			_, err = idemd.Middleware(nil, routes)
		}
		if err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

// TestMiddlewareLatency measures what the middleware costs at one request in
// flight (docs/sdk.md records the numbers): the same app with and without
// it, and a raw Claim+Complete pair against the same idemd, 200 of each
// taken in turn (so that a load change on the machine hits all three alike),
// a new connection per HTTP request. test.sh runs it on its own, after the
// rest. A fresh key must add at most the pair plus 2 ms (p50): the pair is
// idemd's share, the rest the middleware's own (a client or channel per
// request, a missing TCP_NODELAY, a goroutine handoff, a sleep); it also
// fails when a replay's p50 is over 10 ms.
func TestMiddlewareLatency(t *testing.T) {
	_, routes := loadHTTPScenarios(t)
	client := aliceClient(t)
	mw, err := idemd.Middleware(client, routes)
	if err != nil {
		t.Fatal(err)
	}
	bareState := &appState{executions: map[string]int{}}
	state := &appState{executions: map[string]int{}}
	bare := httptest.NewServer(http.HandlerFunc(bareState.app))
	defer bare.Close()
	front := httptest.NewServer(mw(http.HandlerFunc(state.app)))
	defer front.Close()
	prefix := randomHex(6)
	const body = `{"amount":4200,"currency":"usd","customer":"cus_8812"}`
	send := func(url, kind string, i int) time.Duration {
		started := time.Now()
		r, err := sendStep(url, map[string]any{"method": "POST", "path": "/v1/payments/p1", "body": body,
			"headers": []any{[]any{"idempotency-key", fmt.Sprintf("%s-%s-%d", prefix, kind, i)},
				[]any{"content-type", "application/json"}}}, "")
		elapsed := time.Since(started)
		if err != nil || r.status != 201 {
			t.Fatalf("%s %d: %v %v", kind, i, err, r)
		}
		return elapsed
	}
	ctx := context.Background()
	pair := func(i int) time.Duration {
		key := fmt.Sprintf("%s-pair-%d", prefix, i)
		started := time.Now()
		claim, err := client.Claim(ctx, &idemdv1.ClaimRequest{Endpoint: "POST /v1/payments", Key: key, AttemptId: key,
			Fingerprint: &idemdv1.ClaimRequest_Request{Request: &idemdv1.HttpRequest{
				Method: "POST", Path: "/v1/payments/p1", ContentType: "application/json", Body: []byte(body)}}})
		if err == nil {
			_, err = client.Complete(ctx, &idemdv1.CompleteRequest{Endpoint: "POST /v1/payments", Key: key,
				LeaseToken: claim.GetClaimed().GetLeaseToken(), Response: &idemdv1.StoredResponse{Status: 201, Body: []byte(`{"id":"pay_1"}`)}})
		}
		if err != nil {
			t.Fatalf("pair %d: %v", i, err)
		}
		return time.Since(started)
	}
	for i := range 20 {
		send(bare.URL, "warm", i)
		send(front.URL, "warm", i)
		pair(-1 - i)
	}
	const samples = 200
	var without, fresh, pairs, replay []time.Duration
	for i := range samples {
		without = append(without, send(bare.URL, "bare", i))
		fresh = append(fresh, send(front.URL, "fresh", i))
		pairs = append(pairs, pair(i))
	}
	for i := range samples {
		replay = append(replay, send(front.URL, "fresh", i))
	}
	added := percentile(fresh, 50) - percentile(without, 50)
	t.Logf("latency: net/http middleware, one in flight, %d requests each: without p50 %s; fresh p50 %s (adds %s; "+
		"a Claim+Complete pair p50 %s); replay p50 %s",
		samples, ms(percentile(without, 50)), ms(percentile(fresh, 50)), ms(added), ms(percentile(pairs, 50)),
		ms(percentile(replay, 50)))
	if limit := percentile(pairs, 50) + 2*time.Millisecond; added > limit {
		t.Errorf("a fresh key adds %s (p50), more than the Claim+Complete pair plus 2 ms (%s)", ms(added), ms(limit))
	}
	if percentile(replay, 50) > 10*time.Millisecond {
		t.Errorf("replay p50 %s", ms(percentile(replay, 50)))
	}
}
