package idemd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Route is one route of the HTTP middleware, as in idemd proxy's routes
// file (docs/proxy.md). Path is a template: {name} matches one segment and
// names the endpoint ("POST /v1/payments/{id}": every payment shares one
// endpoint); a final /* matches any rest and the endpoint is the request's
// own path. Zero fields inherit the defaults.
type Route struct {
	Path string `json:"path"`
	// Methods made idempotent (default POST and PATCH); others pass through.
	Methods []string `json:"methods"`
	// Key is "require" (default; no key: 400) or "optional" (no key: passed through).
	Key string `json:"key"`
	// MaxRequestBytes: larger bodies get 413 before any claim (default 1 MiB).
	MaxRequestBytes int64 `json:"max_request_bytes"`
	// MaxResponseBytes: larger answers are returned, not stored; the key is
	// left UNKNOWN (default 256 KiB).
	MaxResponseBytes int `json:"max_response_bytes"`
	// MaxWait is how long a duplicate waits for the first (default 0: 409 at once).
	MaxWait Duration `json:"max_wait"`
	// On5xx is "release" (default: a 5xx frees the key) or "store" (replayed).
	On5xx string `json:"on_5xx"`
	// IgnoreFields are JSON Pointers left out of the fingerprint.
	IgnoreFields []string `json:"ignore_fields"`
	// StoreHeaders are the response headers stored and replayed; Set-Cookie
	// only if listed (a replay would hand one caller's session to another).
	StoreHeaders []string `json:"store_headers"`
	// Fingerprint is "server" (default: the body goes to idemd) or "local"
	// (only its SHA-256 does).
	Fingerprint string `json:"fingerprint"`
	// TTL and Lease override the endpoint policy's.
	TTL   Duration `json:"ttl"`
	Lease Duration `json:"lease"`
	// ExposeFailureReason adds the key's stored Fail reason (a handler's
	// panic value or ReportFailure text) to the 409 outcome_pending answer.
	// For development only: the reason is written for operators and may
	// carry internal names or secrets, and the 409 goes to whoever retries.
	// A route's false inherits the defaults' setting.
	ExposeFailureReason bool `json:"expose_failure_reason"`
}

// Duration is a time.Duration that reads "5s" / "250ms" (the routes file's
// spelling) from JSON.
type Duration time.Duration

// UnmarshalJSON reads a duration string or a number of milliseconds.
func (d *Duration) UnmarshalJSON(data []byte) error {
	var text string
	if err := json.Unmarshal(data, &text); err == nil {
		parsed, err := time.ParseDuration(text)
		if err != nil {
			return fmt.Errorf("%q is not a duration such as 5s or 250ms", text)
		}
		*d = Duration(parsed)
		return nil
	}
	var ms float64
	if err := json.Unmarshal(data, &ms); err != nil {
		return fmt.Errorf("%s is not a duration", data)
	}
	*d = Duration(time.Duration(ms * float64(time.Millisecond)))
	return nil
}

// RoutesConfig is the middleware's routes, the JSON form of idemd proxy's
// routes file: the first route whose path matches wins, a request no route
// matches gets Defaults.
type RoutesConfig struct {
	Defaults Route   `json:"defaults"`
	Routes   []Route `json:"routes"`
}

// ParseRoutes reads a RoutesConfig from JSON; names in ignore (such as the
// proxy's "upstream_timeout") are dropped, any other unknown name is an error.
func ParseRoutes(data []byte, ignore ...string) (RoutesConfig, error) {
	var raw struct {
		Defaults map[string]json.RawMessage   `json:"defaults"`
		Routes   []map[string]json.RawMessage `json:"routes"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return RoutesConfig{}, fmt.Errorf("routes: %w", err)
	}
	decode := func(table map[string]json.RawMessage, where string) (Route, error) {
		for _, name := range ignore {
			delete(table, name)
		}
		clean, err := json.Marshal(table)
		if err != nil {
			return Route{}, err
		}
		dec := json.NewDecoder(bytes.NewReader(clean))
		dec.DisallowUnknownFields()
		var route Route
		if err := dec.Decode(&route); err != nil {
			return Route{}, fmt.Errorf("%s: %w", where, err)
		}
		return route, nil
	}
	var config RoutesConfig
	var err error
	if raw.Defaults != nil {
		if config.Defaults, err = decode(raw.Defaults, "defaults"); err != nil {
			return RoutesConfig{}, err
		}
	}
	for i, table := range raw.Routes {
		route, err := decode(table, fmt.Sprintf("routes[%d]", i))
		if err != nil {
			return RoutesConfig{}, err
		}
		config.Routes = append(config.Routes, route)
	}
	return config, nil
}

// DefaultStoreHeaders describe a response's body and the resource it
// created; never credentials or cookies.
var DefaultStoreHeaders = []string{"content-type", "content-encoding", "content-language",
	"content-location", "location", "etag", "last-modified", "link"}

// routeSettings is a route with every default filled in.
type routeSettings struct {
	methods          map[string]bool
	keyRequired      bool
	maxRequestBytes  int64
	maxResponseBytes int
	maxWait          time.Duration
	on5xxStore       bool
	ignoreFields     []string
	storeHeaders     map[string]bool
	localFingerprint bool
	ttl, lease       time.Duration
	exposeReason     bool
}

var baseRoute = Route{
	Methods: []string{"POST", "PATCH"}, Key: "require", MaxRequestBytes: 1 << 20,
	MaxResponseBytes: 256 << 10, On5xx: "release", StoreHeaders: DefaultStoreHeaders, Fingerprint: "server",
}

func merge(route, base Route) Route {
	out := base
	if route.Methods != nil {
		out.Methods = route.Methods
	}
	if route.Key != "" {
		out.Key = route.Key
	}
	if route.MaxRequestBytes != 0 {
		out.MaxRequestBytes = route.MaxRequestBytes
	}
	if route.MaxResponseBytes != 0 {
		out.MaxResponseBytes = route.MaxResponseBytes
	}
	if route.MaxWait != 0 {
		out.MaxWait = route.MaxWait
	}
	if route.On5xx != "" {
		out.On5xx = route.On5xx
	}
	if route.IgnoreFields != nil {
		out.IgnoreFields = route.IgnoreFields
	}
	if route.StoreHeaders != nil {
		out.StoreHeaders = route.StoreHeaders
	}
	if route.Fingerprint != "" {
		out.Fingerprint = route.Fingerprint
	}
	if route.TTL != 0 {
		out.TTL = route.TTL
	}
	if route.Lease != 0 {
		out.Lease = route.Lease
	}
	out.ExposeFailureReason = out.ExposeFailureReason || route.ExposeFailureReason
	return out
}

func settle(route Route, where string) (*routeSettings, error) {
	if route.Key != "require" && route.Key != "optional" {
		return nil, fmt.Errorf("%s.key: %q must be \"require\" or \"optional\"", where, route.Key)
	}
	if route.On5xx != "release" && route.On5xx != "store" {
		return nil, fmt.Errorf("%s.on_5xx: %q must be \"release\" or \"store\"", where, route.On5xx)
	}
	if route.Fingerprint != "server" && route.Fingerprint != "local" {
		return nil, fmt.Errorf("%s.fingerprint: %q must be \"server\" or \"local\"", where, route.Fingerprint)
	}
	if route.MaxRequestBytes < 0 || route.MaxResponseBytes < 0 {
		return nil, fmt.Errorf("%s: byte limits must not be negative", where)
	}
	s := &routeSettings{
		methods: map[string]bool{}, keyRequired: route.Key == "require",
		maxRequestBytes: route.MaxRequestBytes, maxResponseBytes: route.MaxResponseBytes,
		maxWait: time.Duration(route.MaxWait), on5xxStore: route.On5xx == "store",
		ignoreFields: route.IgnoreFields, storeHeaders: map[string]bool{},
		localFingerprint: route.Fingerprint == "local", ttl: time.Duration(route.TTL), lease: time.Duration(route.Lease),
		exposeReason: route.ExposeFailureReason,
	}
	for _, m := range route.Methods {
		s.methods[strings.ToUpper(m)] = true
	}
	for _, h := range route.StoreHeaders {
		s.storeHeaders[strings.ToLower(h)] = true
	}
	return s, nil
}

type compiledRoute struct {
	template string
	segments []*string // nil: {name}
	rest     bool
	settings *routeSettings
}

// Middleware makes the routes' marked methods of an http.Handler idempotent
// by Idempotency-Key, with idemd proxy's answers (docs/proxy.md): it works
// with net/http, chi, gorilla/mux and any router taking
// func(http.Handler) http.Handler.
//
// For a request it makes idempotent, the body is read once (up to
// MaxRequestBytes, else 413) and handed to the handler unchanged; the key is
// claimed and the handler runs once per key, its lease extended while it
// runs; its answer is buffered, stored and sent. Retries get the stored
// answer with Idempotent-Replayed: true; a duplicate in flight 409 with
// Retry-After (or a wait of MaxWait); another body under the key 422; an
// undecided outcome 409 outcome_pending. A handler that panics leaves the
// key UNKNOWN (released when the panic value is a NoSideEffect error) and
// the panic continues; a 5xx releases the key unless On5xx is "store". The
// handler finds its Execution (for DownstreamKey) with ExecutionFrom.
//
// It must see the request body first: a body that something mounted before
// it has read or parsed (io.ReadAll(r.Body), r.ParseForm, r.FormValue) gets
// a 500 problem middleware_order at once, the key unclaimed and the handler
// not run, and the mistake is logged once (error level, WithMiddlewareLogger).
func Middleware(c *Client, config RoutesConfig, opts ...MiddlewareOption) (func(http.Handler) http.Handler, error) {
	var o middlewareOptions
	for _, opt := range opts {
		opt(&o)
	}
	base := merge(config.Defaults, baseRoute)
	defaults, err := settle(base, "defaults")
	if err != nil {
		return nil, err
	}
	var exposing []string
	if defaults.exposeReason {
		exposing = append(exposing, "defaults")
	}
	routes := make([]compiledRoute, 0, len(config.Routes))
	for i, route := range config.Routes {
		where := fmt.Sprintf("routes[%d]", i)
		segments, rest, err := pattern(route.Path, where+".path")
		if err != nil {
			return nil, err
		}
		settings, err := settle(merge(route, base), where)
		if err != nil {
			return nil, err
		}
		routes = append(routes, compiledRoute{template: route.Path, segments: segments, rest: rest, settings: settings})
		if settings.exposeReason && !defaults.exposeReason {
			exposing = append(exposing, route.Path)
		}
	}
	m := &middleware{client: c, routes: routes, defaults: defaults, logger: o.logger}
	if len(exposing) > 0 {
		// As idemd proxy does at start-up: the setting is for development,
		// and a production deployment that inherits it should be noticed.
		m.log().Warn("idemd middleware: expose_failure_reason is on: 409 outcome_pending answers on these routes "+
			"carry the stored failure reason (handler error text) to every caller; for development only",
			"routes", exposing)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
	}, nil
}

func pattern(path, where string) ([]*string, bool, error) {
	if !strings.HasPrefix(path, "/") {
		return nil, false, fmt.Errorf("%s: %q must start with /", where, path)
	}
	parts := strings.Split(strings.TrimLeft(path, "/"), "/")
	var segments []*string
	rest := false
	for i, part := range parts {
		switch {
		case part == "*":
			if i+1 != len(parts) {
				return nil, false, fmt.Errorf("%s: %q: * may only be the last segment", where, path)
			}
			rest = true
		case strings.HasPrefix(part, "{") && strings.HasSuffix(part, "}") && len(part) > 2:
			segments = append(segments, nil)
		case strings.ContainsAny(part, "{}*"):
			return nil, false, fmt.Errorf("%s: %q: segment %q is neither literal, {name} nor a final *", where, path, part)
		default:
			literal := part
			segments = append(segments, &literal)
		}
	}
	return segments, rest, nil
}

// MiddlewareOption configures Middleware.
type MiddlewareOption func(*middlewareOptions)

type middlewareOptions struct{ logger *slog.Logger }

// WithMiddlewareLogger is where the middleware reports a misconfiguration
// (mounted after something that read the body; expose_failure_reason on).
// Default: slog.Default() at the time of the report. The middleware logs
// nothing else, and never a key or a body.
func WithMiddlewareLogger(logger *slog.Logger) MiddlewareOption {
	return func(o *middlewareOptions) { o.logger = logger }
}

type middleware struct {
	client   *Client
	routes   []compiledRoute
	defaults *routeSettings
	logger   *slog.Logger
	// orderLogged: a wrong mount order is one mistake, whatever the number
	// of requests it spoils, so it is logged once per middleware.
	orderLogged sync.Once
}

func (m *middleware) log() *slog.Logger {
	if m.logger != nil {
		return m.logger
	}
	return slog.Default()
}

func (m *middleware) find(method, path string) (string, *routeSettings) {
	parts := strings.Split(strings.TrimLeft(path, "/"), "/")
	for _, route := range m.routes {
		if len(parts) < len(route.segments) || (!route.rest && len(parts) != len(route.segments)) {
			continue
		}
		ok := true
		for i, segment := range route.segments {
			if segment != nil && *segment != parts[i] {
				ok = false
				break
			}
		}
		if ok {
			if route.rest {
				return method + " " + path, route.settings
			}
			return method + " " + route.template, route.settings
		}
	}
	return method + " " + path, m.defaults
}

var keyPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,255}$`)

// ParseIdempotencyKey reads an Idempotency-Key value: a Structured Field
// string (RFC 8941 section 3.3.3, as the draft specifies) or the bare token
// Stripe-style clients send; then idemd's key rule. The error says what is
// wrong.
func ParseIdempotencyKey(value string) (string, error) {
	text := strings.Trim(value, " ")
	if strings.HasPrefix(text, "\"") {
		var key strings.Builder
		i := 1
		for {
			if i >= len(text) {
				return "", errors.New("is a Structured Field string without its closing quote")
			}
			c := text[i]
			i++
			if c == '"' {
				break
			}
			switch {
			case c == '\\':
				if i >= len(text) || (text[i] != '"' && text[i] != '\\') {
					return "", errors.New(`has an escape other than \" or \\ in its Structured Field string`)
				}
				key.WriteByte(text[i])
				i++
			case c >= ' ' && c <= '~':
				key.WriteByte(c)
			default:
				return "", errors.New("has a character a Structured Field string cannot hold")
			}
		}
		if i != len(text) {
			return "", errors.New("has characters after its Structured Field string")
		}
		text = key.String()
	}
	if text == "" {
		return "", errors.New("must not be empty")
	}
	if !keyPattern.MatchString(text) {
		return "", errors.New("must be 1-255 characters of [A-Za-z0-9_-]")
	}
	return text, nil
}

type executionKey struct{}

type failureKey struct{}

// failure is where ReportFailure leaves a handler's error for the middleware.
type failure struct{ err error }

// ReportFailure tells the middleware that the handler serving ctx's request
// failed with err while answering an error of its own: the answer it writes
// is returned but not stored, and the key is released if err is marked with
// NoSideEffect, else left UNKNOWN with err's text as the reason (retries get
// 409 outcome_pending until reconciled). Without it, only a panic or a 5xx
// (per On5xx) tells the middleware that something went wrong. A no-op for a
// request the middleware did not claim.
func ReportFailure(ctx context.Context, err error) {
	if f, ok := ctx.Value(failureKey{}).(*failure); ok && err != nil {
		f.err = err
	}
}

// ExecutionFrom is the Execution of a request the middleware claimed (for
// DownstreamKey); false for requests it passed through.
func ExecutionFrom(ctx context.Context) (Execution, bool) {
	ex, ok := ctx.Value(executionKey{}).(Execution)
	return ex, ok
}

// answer is a whole HTTP answer.
type answer struct {
	status  int
	headers http.Header
	body    []byte
}

// released is a 5xx on a route that releases the key; unstorable is an
// answer that is not stored (the key is UNKNOWN). Both go back as they are.
type released struct{ answer *answer }

func (e *released) Error() string { return fmt.Sprintf("handler answered %d", e.answer.status) }

type unstorable struct {
	answer *answer
	reason string
}

func (e *unstorable) Error() string { return e.reason }

// panicked carries a handler's panic out of ExecuteOnce, to continue it.
type panicked struct{ value any }

func (e *panicked) Error() string { return panicReason(e.value) }

// formParsedBy names the net/http parser that has read r's body into a form
// ("" if none has): ParseForm reads a urlencoded body whatever its length,
// ParseMultipartForm a multipart one, and both leave their result on r. A
// form parsed from the query or a body of another type leaves the body alone.
func formParsedBy(r *http.Request) string {
	if r.MultipartForm != nil {
		return "r.ParseMultipartForm (or r.FormValue, r.FormFile)"
	}
	if r.PostForm != nil {
		if mediaType, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mediaType == "application/x-www-form-urlencoded" {
			return "r.ParseForm (or r.FormValue, r.PostFormValue)"
		}
	}
	return ""
}

// refuseOrder answers a request whose body was consumed before the
// middleware saw it, before any Claim: the handler would get an empty body
// and the fingerprint would be of nothing, so serving it is worse than
// failing loudly.
func (m *middleware) refuseOrder(w http.ResponseWriter, endpoint, reader string) {
	detail := "the request body was read before the idempotency middleware saw it (by " + reader +
		"); mount the middleware before any body parser"
	m.orderLogged.Do(func() {
		m.log().Error("idemd middleware: "+detail+"; answering 500 middleware_order until fixed", "endpoint", endpoint)
	})
	writeProblem(w, 500, "middleware_order", detail, nil, 0)
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	method := strings.ToUpper(r.Method)
	endpoint, settings := m.find(method, r.URL.Path)
	if !settings.methods[method] {
		next.ServeHTTP(w, r)
		return
	}
	values, present := r.Header[http.CanonicalHeaderKey("Idempotency-Key")]
	if !present || len(values) == 0 {
		if !settings.keyRequired {
			next.ServeHTTP(w, r)
			return
		}
		writeProblem(w, 400, "idempotency_key_missing",
			fmt.Sprintf("%s %s requires an Idempotency-Key header", method, r.URL.Path), nil, 0)
		return
	}
	key, err := ParseIdempotencyKey(values[0])
	if err != nil {
		writeProblem(w, 400, "idempotency_key_malformed", "Idempotency-Key "+err.Error(),
			[]problemMember{{"field", "Idempotency-Key"}}, 0)
		return
	}
	if parser := formParsedBy(r); parser != "" {
		m.refuseOrder(w, endpoint, parser)
		return
	}
	var body []byte
	if r.Body != nil {
		body, err = io.ReadAll(io.LimitReader(r.Body, settings.maxRequestBytes+1))
	}
	// A body read to its end before us reads as empty (or short), not as an
	// error: Content-Length is what tells the two apart. Within the limit,
	// fewer bytes than declared means someone else has them (a client that
	// sends fewer gets io.ErrUnexpectedEOF from net/http instead). A chunked
	// body (ContentLength -1) declares nothing, so an empty one is taken as
	// empty: only ParseForm leaves a trace there (formParsedBy).
	if errors.Is(err, http.ErrBodyReadAfterClose) ||
		(err == nil && int64(len(body)) <= settings.maxRequestBytes && int64(len(body)) < r.ContentLength) {
		m.refuseOrder(w, endpoint, "a handler or middleware reading r.Body")
		return
	}
	if err != nil {
		writeProblem(w, 400, "request_body_unreadable", "reading the request body failed: "+err.Error(), nil, 0)
		return
	}
	if int64(len(body)) > settings.maxRequestBytes {
		writeProblem(w, 413, "request_too_large", fmt.Sprintf("request body exceeds %d bytes", settings.maxRequestBytes), nil, 0)
		return
	}
	opts := []ExecuteOption{WithMaxWait(settings.maxWait)}
	if settings.localFingerprint {
		opts = append(opts, WithLocalFingerprint())
	}
	if settings.lease > 0 {
		opts = append(opts, WithLease(settings.lease))
	}
	if settings.ttl > 0 {
		opts = append(opts, WithTTL(settings.ttl))
	}
	request := HTTPRequest{Method: method, Path: r.URL.RequestURI(), ContentType: r.Header.Get("Content-Type"),
		Body: body, IgnoreFields: settings.ignoreFields}
	var fresh *answer
	result, err := m.client.ExecuteOnce(r.Context(), endpoint, key, request,
		func(ctx context.Context, ex Execution) (resp *Response, err error) {
			reported := &failure{}
			inner := r.Clone(context.WithValue(context.WithValue(ctx, executionKey{}, ex), failureKey{}, reported))
			inner.Body = io.NopCloser(bytes.NewReader(body))
			inner.ContentLength = int64(len(body))
			recorder := &recorder{header: http.Header{}}
			defer func() {
				if value := recover(); value != nil {
					if e, ok := value.(error); ok && IsNoSideEffect(e) {
						err = NoSideEffect(&panicked{value: value})
						return
					}
					panic(value) // the executor records UNKNOWN, then panics on
				}
			}()
			next.ServeHTTP(recorder, inner)
			got := recorder.answer()
			if reported.err != nil {
				if IsNoSideEffect(reported.err) {
					return nil, NoSideEffect(&released{answer: got})
				}
				return nil, &unstorable{answer: got, reason: reported.err.Error()}
			}
			if got.status >= 500 && !settings.on5xxStore {
				return nil, NoSideEffect(&released{answer: got})
			}
			if len(got.body) > settings.maxResponseBytes {
				return nil, &unstorable{answer: got, reason: fmt.Sprintf(
					"answer exceeds max_response_bytes (%d bytes); returned to the caller, not stored", settings.maxResponseBytes)}
			}
			fresh = got
			stored := &Response{Status: got.status, Body: got.body}
			for name, vs := range got.headers {
				if settings.storeHeaders[strings.ToLower(name)] {
					for _, v := range vs {
						stored.Headers = append(stored.Headers, Header{Name: strings.ToLower(name), Value: v})
					}
				}
			}
			return stored, nil
		}, opts...)
	var rel *released
	var uns *unstorable
	var pan *panicked
	var inProgress *InProgressError
	var reuse *KeyReuseError
	var pending *OutcomePendingError
	switch {
	case err == nil && result.Replayed:
		h := w.Header()
		for _, header := range result.Response.Headers {
			h.Add(header.Name, header.Value)
		}
		h.Set("Idempotent-Replayed", "true")
		h.Set("Content-Length", strconv.Itoa(len(result.Response.Body)))
		w.WriteHeader(result.Response.Status)
		_, _ = w.Write(result.Response.Body)
	case err == nil:
		writeAnswer(w, fresh)
	case errors.As(err, &pan):
		panic(pan.value)
	case errors.As(err, &rel):
		writeAnswer(w, rel.answer)
	case errors.As(err, &uns):
		writeAnswer(w, uns.answer)
	case fresh != nil:
		// The handler ran (its side effect happened) but recording the answer
		// failed: the caller still gets it; the executor left the key to its
		// lease or marked it UNKNOWN.
		writeAnswer(w, fresh)
	case errors.As(err, &inProgress):
		writeProblem(w, 409, "request_in_progress",
			"a request with this Idempotency-Key is in progress; retry after Retry-After", nil, inProgress.RetryAfter)
	case errors.As(err, &reuse):
		writeProblem(w, 422, "idempotency_key_reuse",
			"this Idempotency-Key was used for a different request (method, path or body); use a new key for a new operation", nil, 0)
	case errors.As(err, &pending):
		// The reason is for operators (Lookup, the audit log): a handler's
		// panic text may name internals or secrets, and this answer goes to
		// whoever retries (http-scenarios.md, "What an HTTP caller learns").
		extra := []problemMember{{"state", pending.State.String()}}
		if settings.exposeReason {
			extra = append(extra, problemMember{"reason", pending.Reason})
		}
		writeProblem(w, 409, "outcome_pending",
			"the outcome of the first request with this Idempotency-Key is not known; it is waiting for an operator's decision",
			extra, 0)
	default:
		code := status.Code(err)
		writeProblem(w, httpOfCode(code), strings.ToLower(code.String()), err.Error(), []problemMember{{"grpc_code", code.String()}}, 0)
	}
}

// recorder buffers a handler's answer.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}
func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(p)
}
func (r *recorder) answer() *answer {
	status := r.status
	if status == 0 {
		status = http.StatusOK
	}
	return &answer{status: status, headers: r.header, body: r.body.Bytes()}
}

func writeAnswer(w http.ResponseWriter, a *answer) {
	h := w.Header()
	for name, values := range a.headers {
		h[name] = values
	}
	h.Set("Content-Length", strconv.Itoa(len(a.body)))
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
}

// problemMember is one member of a problem body beyond type, title, status and
// detail.
type problemMember struct {
	name  string
	value any
}

// writeProblem answers an RFC 9457 problem whose members come in the order
// the other SDKs write them: type, title, status, detail, then the extras as
// given (a map would sort them).
func writeProblem(w http.ResponseWriter, status int, name, detail string, extra []problemMember, retryAfter time.Duration) {
	members := append([]problemMember{{"type", "https://idemd.dev/problems/" + name}, {"title", http.StatusText(status)},
		{"status", status}, {"detail", detail}}, extra...)
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			buf.WriteByte(',')
		}
		name, _ := json.Marshal(m.name)
		value, _ := json.Marshal(m.value)
		buf.Write(name)
		buf.WriteByte(':')
		buf.Write(value)
	}
	buf.WriteByte('}')
	body := buf.Bytes()
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	if status == 409 && name == "request_in_progress" {
		h.Set("Retry-After", strconv.Itoa(int(math.Max(1, math.Ceil(retryAfter.Seconds())))))
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func httpOfCode(code codes.Code) int {
	switch code {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return 400
	case codes.NotFound:
		return 404
	case codes.AlreadyExists, codes.Aborted:
		return 409
	case codes.PermissionDenied:
		return 403
	case codes.Unauthenticated:
		return 401
	case codes.ResourceExhausted:
		return 429
	case codes.Unimplemented:
		return 501
	case codes.Unavailable:
		return 503
	case codes.DeadlineExceeded:
		return 504
	default:
		return 500
	}
}
