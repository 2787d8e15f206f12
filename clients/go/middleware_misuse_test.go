package idemd_test

// The middleware when things go wrong: mounted after something that read
// the body, and what a caller and an operator learn about a handler that
// panicked (http-scenarios.md, "What an HTTP caller learns about a failed
// handler").

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	idemd "github.com/idemd/idemd/clients/go"
	idemdv1 "github.com/idemd/idemd/clients/go/gen/idemd/v1"
)

// logRecorder keeps the records of a slog.Logger.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r)
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

// text is every record at level or above, message and attributes.
func (l *logRecorder) text(level slog.Level) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.records {
		if r.Level < level {
			continue
		}
		line := r.Message
		r.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
		out = append(out, line)
	}
	return out
}

// keyedPost is a POST of body to url+path under key; chunked sends it
// without Content-Length (the server sees ContentLength -1).
func keyedPost(t *testing.T, url, path, key, contentType, body string, chunked bool) (*reply, time.Duration) {
	t.Helper()
	// A strings.Reader has a known length: Content-Length (0 as well).
	var reader io.Reader = strings.NewReader(body)
	if chunked {
		reader = io.NopCloser(reader)
	}
	req, err := http.NewRequest("POST", url+path, reader)
	if err != nil {
		t.Fatal(err)
	}
	if chunked {
		req.ContentLength, req.TransferEncoding = -1, []string{"chunked"}
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", contentType)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	started := time.Now()
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	elapsed := time.Since(started)
	if err != nil {
		t.Fatal(err)
	}
	return &reply{status: res.StatusCode, headers: res.Header, body: data}, elapsed
}

// A body reader mounted before the middleware leaves the handler an empty
// body and the fingerprint nothing to hash: the middleware must refuse at
// once, before any Claim, and say why, once, in the log.
func TestMiddlewareMountedAfterABodyReader(t *testing.T) {
	client := aliceClient(t)
	const endpoint, path = "POST /v1/payments/{id}", "/v1/payments/p1"
	routes := idemd.RoutesConfig{Routes: []idemd.Route{{Path: "/v1/payments/{id}"}}}
	readers := []struct {
		name        string
		wrap        func(w http.ResponseWriter, r *http.Request)
		contentType string
		body        string
		chunked     bool
	}{
		{"io.ReadAll(r.Body)", func(_ http.ResponseWriter, r *http.Request) { _, _ = io.ReadAll(r.Body) },
			"application/json", `{"amount":4200}`, false},
		{"io.ReadAll(r.Body) and Close", func(_ http.ResponseWriter, r *http.Request) { _, _ = io.ReadAll(r.Body); r.Body.Close() },
			"application/json", `{"amount":4200}`, false},
		{"r.Body = http.NoBody", func(_ http.ResponseWriter, r *http.Request) { r.Body = http.NoBody },
			"application/json", `{"amount":4200}`, false},
		// Chunked: no Content-Length to compare with, only ParseForm's result.
		{"r.ParseForm(), chunked", func(_ http.ResponseWriter, r *http.Request) { _ = r.ParseForm() },
			"application/x-www-form-urlencoded", "amount=4200", true},
	}
	for _, reader := range readers {
		t.Run(reader.name, func(t *testing.T) {
			logs := &logRecorder{}
			mw, err := idemd.Middleware(client, routes, idemd.WithMiddlewareLogger(slog.New(logs)))
			if err != nil {
				t.Fatal(err)
			}
			state := &appState{executions: map[string]int{}}
			app := mw(http.HandlerFunc(state.app))
			server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				reader.wrap(w, r)
				app.ServeHTTP(w, r)
			}))
			defer server.Close()
			var keys []string
			for range 2 {
				key := newKey(t)
				keys = append(keys, key)
				r, elapsed := keyedPost(t, server.URL, path, key, reader.contentType, reader.body, reader.chunked)
				var problem struct {
					Type, Title, Detail string
					Status              int
				}
				_ = json.Unmarshal(r.body, &problem)
				if r.status != 500 || r.headers.Get("Content-Type") != "application/problem+json" ||
					problem.Type != "https://idemd.dev/problems/middleware_order" || problem.Title != "Internal Server Error" ||
					problem.Status != 500 || !strings.Contains(problem.Detail, "mount the middleware before any body parser") {
					t.Fatalf("answer %d %v %s", r.status, r.headers, r.body)
				}
				if elapsed >= time.Second {
					t.Errorf("answered in %s, want well under 1 s", elapsed)
				}
				if got := lookupState(t, client, endpoint, key); got != "NOT_FOUND" {
					t.Errorf("key %s: Lookup says %s, want NOT_FOUND (never claimed)", key, got)
				}
			}
			if n := state.of(path); n != 0 {
				t.Errorf("the handler ran %d times", n)
			}
			errors := logs.text(slog.LevelError)
			if len(errors) != 1 || !strings.Contains(errors[0], "mount the middleware before any body parser") {
				t.Fatalf("error log %q, want one record naming the mistake", errors)
			}
			for _, key := range keys {
				if strings.Contains(errors[0], key) {
					t.Errorf("the log names the key: %s", errors[0])
				}
			}
		})
	}
}

// Bodies that are legitimately empty are not taken for consumed ones: none
// at all, and a chunked one with no chunks (ContentLength -1).
func TestMiddlewareTakesAnEmptyBodyForEmpty(t *testing.T) {
	client := aliceClient(t)
	routes := idemd.RoutesConfig{Routes: []idemd.Route{{Path: "/v1/payments/{id}"}}}
	mw, err := idemd.Middleware(client, routes)
	if err != nil {
		t.Fatal(err)
	}
	state := &appState{executions: map[string]int{}}
	app := mw(http.HandlerFunc(state.app))
	var mu sync.Mutex
	var lengths []int64
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		lengths = append(lengths, r.ContentLength)
		mu.Unlock()
		app.ServeHTTP(w, r)
	}))
	defer server.Close()
	for _, chunked := range []bool{false, true} {
		key := newKey(t)
		r, _ := keyedPost(t, server.URL, "/v1/payments/e1", key, "application/json", "", chunked)
		if r.status != 201 {
			t.Fatalf("chunked %v: %d %s", chunked, r.status, r.body)
		}
		if got := lookupState(t, client, "POST /v1/payments/{id}", key); got != "COMPLETED" {
			t.Errorf("chunked %v: Lookup says %s", chunked, got)
		}
	}
	if len(lengths) != 2 || lengths[0] != 0 || lengths[1] != -1 {
		t.Fatalf("the server saw Content-Lengths %v, want [0 -1]", lengths)
	}
}

// A handler's panic is stored as "panic: <value>" for operators; the 409 a
// retry gets names the key's state only, unless the route exposes the
// reason. The exact bodies also pin the members' order, the same in every
// SDK: type, title, status, detail, then state, reason.
func TestMiddlewarePanicReason(t *testing.T) {
	_, routes := loadHTTPScenarios(t)
	client := aliceClient(t)
	logs := &logRecorder{}
	mw, err := idemd.Middleware(client, routes, idemd.WithMiddlewareLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	// The development setting is announced, as idemd proxy does at start-up.
	if warnings := logs.text(slog.LevelWarn); len(warnings) != 1 || !strings.Contains(warnings[0], "/crash-exposed/*") ||
		strings.Contains(warnings[0], "/crash/*") {
		t.Errorf("warnings %q, want one naming /crash-exposed/* only", warnings)
	}
	state := &appState{executions: map[string]int{}}
	server := httptest.NewUnstartedServer(mw(http.HandlerFunc(state.app)))
	server.Config.ErrorLog = log.New(io.Discard, "", 0) // the panics below are expected
	server.Start()
	defer server.Close()
	const pending = `{"type":"https://idemd.dev/problems/outcome_pending","title":"Conflict","status":409,` +
		`"detail":"the outcome of the first request with this Idempotency-Key is not known; it is waiting for an operator's decision",` +
		`"state":"STATE_UNKNOWN"`
	for path, want := range map[string]string{
		"/crash/r1":         pending + `}`,
		"/crash-exposed/r1": pending + `,"reason":"panic: boom: secret-4711"}`,
	} {
		key := newKey(t)
		req, _ := http.NewRequest("POST", server.URL+path, strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", key)
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
			if res.StatusCode < 500 {
				t.Fatalf("%s: the panicking handler answered %d", path, res.StatusCode)
			}
		}
		got, err := client.Lookup(context.Background(), &idemdv1.LookupRequest{Endpoint: "POST " + path, Key: key})
		if err != nil {
			t.Fatal(err)
		}
		if r := got.GetRecord(); r.GetState() != idemdv1.State_STATE_UNKNOWN || r.GetReason() != "panic: "+crashMessage {
			t.Errorf("%s: record %v, want UNKNOWN with reason %q", path, r, "panic: "+crashMessage)
		}
		again, _ := keyedPost(t, server.URL, path, key, "application/json", "{}", false)
		if again.status != 409 || string(again.body) != want {
			t.Errorf("%s: retry got %d\n%s\nwant\n%s", path, again.status, again.body, want)
		}
	}
}

// One problem body byte for byte, without a server: the members in the
// order every SDK writes them.
func TestMiddlewareProblemMemberOrder(t *testing.T) {
	mw, err := idemd.Middleware(nil, idemd.RoutesConfig{})
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	r := httptest.NewRequest("POST", "/v1/payments", strings.NewReader("{}"))
	r.Header.Set("Idempotency-Key", "not a key")
	mw(http.NotFoundHandler()).ServeHTTP(w, r)
	want := `{"type":"https://idemd.dev/problems/idempotency_key_malformed","title":"Bad Request","status":400,` +
		`"detail":"Idempotency-Key must be 1-255 characters of [A-Za-z0-9_-]","field":"Idempotency-Key"}`
	if got := w.Body.String(); got != want {
		t.Fatalf("problem body\n%s\nwant\n%s", got, want)
	}
}
