// Package idemd is the Go client of idemd, idempotency keys as a service.
//
// A Client exposes the raw RPCs of idemd.v1.Idempotency (Claim, Complete,
// Fail, ExtendLease, Lookup, ListPending, Reconcile) with credentials and a
// default deadline applied, the executor helper ExecuteOnce, which runs a
// handler at most once per idempotency key across retries, processes and
// machines, and on it the HTTP Middleware and the message Consumer. See docs/sdk.md in the idemd repository for the contract.
//
// The SDK never logs; error messages never contain raw keys or bodies.
package idemd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	idemdv1 "github.com/idemd/idemd/clients/go/gen/idemd/v1"
)

// DefaultCallTimeout is the deadline given to an RPC whose context has none.
const DefaultCallTimeout = 10 * time.Second

// Client is a connection to idemd. It is safe for concurrent use; create one
// per process and Close it at shutdown.
//
// The embedded IdempotencyClient is the generated gRPC client: the raw RPCs,
// unchanged. Every call carries the configured credentials and, when its
// context has no deadline, the default per-call deadline (plus the requested
// wait for a Claim).
type Client struct {
	idemdv1.IdempotencyClient

	conn        *grpc.ClientConn
	callTimeout time.Duration
}

type clientOptions struct {
	token       string
	tenant      string
	plaintext   bool
	caFile      string
	tlsConfig   *tls.Config
	clientCert  *clientCertificate
	callTimeout time.Duration
	dialOptions []grpc.DialOption
}

// Option configures a Client.
type Option func(*clientOptions)

// WithToken sends "authorization: Bearer <token>" on every call.
func WithToken(token string) Option { return func(o *clientOptions) { o.token = token } }

// WithTenant sends "x-tenant-id: <tenant>" on every call; only for
// development servers running without authentication.
func WithTenant(tenant string) Option { return func(o *clientOptions) { o.tenant = tenant } }

// WithInsecure connects in plaintext (no TLS). For local development and
// tests only: a bearer token then travels unencrypted.
func WithInsecure() Option { return func(o *clientOptions) { o.plaintext = true } }

// WithCAFile uses TLS and trusts the PEM certificates in path instead of the
// system roots.
func WithCAFile(path string) Option { return func(o *clientOptions) { o.caFile = path } }

// WithTLSConfig uses TLS with the given configuration.
func WithTLSConfig(cfg *tls.Config) Option { return func(o *clientOptions) { o.tlsConfig = cfg } }

// WithClientCertificate uses TLS and presents the PEM certificate chain in
// certFile, with its private key in keyFile, to a server that requires client
// certificates (mTLS); such a server takes the tenant from the certificate.
// The pair is loaded once, by New, which fails if it cannot be (a renewed
// certificate needs a new Client, or WithTLSConfig with a
// GetClientCertificate callback). The server is
// trusted through the system roots, or the CA of WithCAFile when given. It
// conflicts with WithInsecure and with WithTLSConfig (set Certificates in
// that tls.Config instead).
func WithClientCertificate(certFile, keyFile string) Option {
	return func(o *clientOptions) { o.clientCert = &clientCertificate{certFile: certFile, keyFile: keyFile} }
}

type clientCertificate struct{ certFile, keyFile string }

// WithCallTimeout sets the default per-call deadline (DefaultCallTimeout when
// not set; 0 disables it). A context deadline always takes precedence.
func WithCallTimeout(d time.Duration) Option { return func(o *clientOptions) { o.callTimeout = d } }

// WithDialOptions appends gRPC dial options (interceptors, keepalive, ...).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *clientOptions) { o.dialOptions = append(o.dialOptions, opts...) }
}

// New creates a client for target (host:port, or any gRPC target URI). By
// default it uses TLS with the system roots; see WithInsecure, WithCAFile,
// WithClientCertificate and WithTLSConfig. Connecting is lazy: New does not
// wait for the server (a refused handshake surfaces on the first call).
func New(target string, opts ...Option) (*Client, error) {
	o := clientOptions{callTimeout: DefaultCallTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	if target == "" {
		return nil, errors.New("idemd: empty target address")
	}
	var transport credentials.TransportCredentials
	switch {
	case o.plaintext:
		if o.caFile != "" || o.tlsConfig != nil || o.clientCert != nil {
			return nil, errors.New("idemd: WithInsecure conflicts with WithCAFile/WithClientCertificate/WithTLSConfig")
		}
		transport = insecure.NewCredentials()
	case o.tlsConfig != nil && o.caFile != "":
		return nil, errors.New("idemd: use either WithCAFile or WithTLSConfig, not both")
	case o.tlsConfig != nil && o.clientCert != nil:
		return nil, errors.New("idemd: use either WithClientCertificate or WithTLSConfig (with Certificates), not both")
	case o.tlsConfig != nil:
		transport = credentials.NewTLS(o.tlsConfig)
	default:
		cfg := &tls.Config{MinVersion: tls.VersionTLS12} // nil RootCAs: the system roots
		if o.caFile != "" {
			pem, err := os.ReadFile(o.caFile)
			if err != nil {
				return nil, fmt.Errorf("idemd: reading CA file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("idemd: no PEM certificate in CA file %s", o.caFile)
			}
			cfg.RootCAs = pool
		}
		if o.clientCert != nil {
			// Loaded here rather than per handshake so that a wrong path
			// fails New instead of every call.
			cert, err := tls.LoadX509KeyPair(o.clientCert.certFile, o.clientCert.keyFile)
			if err != nil {
				return nil, fmt.Errorf("idemd: loading client certificate: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		transport = credentials.NewTLS(cfg)
	}

	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(transport),
		grpc.WithChainUnaryInterceptor(deadlineInterceptor(o.callTimeout), unprocessedRetryInterceptor()),
	}
	if o.token != "" || o.tenant != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(callCredentials{
			token: o.token, tenant: o.tenant, requireTLS: !o.plaintext,
		}))
	}
	dial = append(dial, o.dialOptions...)
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		return nil, fmt.Errorf("idemd: %w", err)
	}
	return &Client{
		IdempotencyClient: idemdv1.NewIdempotencyClient(conn),
		conn:              conn,
		callTimeout:       o.callTimeout,
	}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Conn returns the underlying gRPC connection (for health checks, or other
// services on the same server).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// callCredentials puts the bearer token and the tenant header on every call.
type callCredentials struct {
	token, tenant string
	requireTLS    bool
}

func (c callCredentials) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	md := make(map[string]string, 2)
	if c.token != "" {
		md["authorization"] = "Bearer " + c.token
	}
	if c.tenant != "" {
		md["x-tenant-id"] = c.tenant
	}
	return md, nil
}

func (c callCredentials) RequireTransportSecurity() bool { return c.requireTLS }

// deadlineInterceptor gives calls without a deadline the default one; a Claim
// that asks the server to wait gets that wait on top.
func deadlineInterceptor(timeout time.Duration) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if _, ok := ctx.Deadline(); !ok && timeout > 0 {
			d := timeout
			if claim, ok := req.(*idemdv1.ClaimRequest); ok && claim.GetWait() != nil {
				d += claim.GetWait().AsDuration()
			}
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, d)
			defer cancel()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// maxUnprocessedAttempts bounds how many times unprocessedRetryInterceptor
// sends a call that the server (or a proxy) never took.
const maxUnprocessedAttempts = 20

// unprocessedRetryInterceptor sends a call again when grpc-go reports that the
// server never processed it: the stream was above the last-stream-id of a
// GOAWAY, or created on (or queued for) a connection that was draining ("the
// connection is draining"), or refused with RST_STREAM REFUSED_STREAM. grpc-go
// retries such a call transparently only once (gRFC A6: a second unprocessed
// attempt surfaces as UNAVAILABLE), which a proxy that sends a GOAWAY every
// few requests (nginx's keepalive_requests) defeats at a few dozen calls in
// flight. Nothing reached idemd, so sending it again is safe for every RPC; it
// happens within the call's deadline, before any retry of the executor, and
// never for an error the server may have seen (a connection that broke with
// the request on it stays an error).
func unprocessedRetryInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		for attempt := 1; ; attempt++ {
			err := invoker(ctx, method, req, reply, cc, opts...)
			again := unprocessed(err) || (idempotentOnServer(method) && endedWithoutStatus(err))
			if err == nil || attempt >= maxUnprocessedAttempts || !again || ctx.Err() != nil {
				return err
			}
			if attempt > 2 {
				// The connections keep refusing it: leave the balancer a
				// moment to bring up a new one.
				t := time.NewTimer(time.Duration(attempt) * 5 * time.Millisecond)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return err
				}
			}
		}
	}
}

// idempotentOnServer reports whether sending method again after an unknown
// outcome can run nothing twice and cannot lose a decision: Complete with
// the same token and response answers the same (idemd stores one
// response), the reads change nothing, and a Claim runs no side effect (a
// second Claim of a key the first one took answers in_progress to its own
// caller: the outcome-unknown answer the caller would get by retrying it
// itself). Fail and ExtendLease are not in it: a Fail that landed would
// be reported as failed by its second sending.
func idempotentOnServer(method string) bool {
	return strings.HasSuffix(method, "/Complete") ||
		strings.HasSuffix(method, "/Claim") ||
		strings.HasSuffix(method, "/Lookup") ||
		strings.HasSuffix(method, "/ListPending")
}

// endedWithoutStatus reports whether err is grpc-go's "Unknown: EOF": the
// connection ended before the call got any status (a proxy closing a
// connection after its GOAWAY, the request maybe never forwarded). Sent
// again only for the RPCs of idempotentOnServer: whether the server took it
// is unknown, and for those it does not matter (the proxy matrix's goaway
// profile met it on Complete: the key stayed IN_PROGRESS).
func endedWithoutStatus(err error) bool {
	if err == nil {
		return false
	}
	// grpc-go returns the transport's io.EOF itself here, not a status.
	s := status.Convert(err)
	return s.Code() == codes.Unknown && s.Message() == "EOF"
}

// unprocessed reports whether err is grpc-go's status for a call the server
// never took (internal/transport's errStreamDrain, or a REFUSED_STREAM reset).
func unprocessed(err error) bool {
	s, ok := status.FromError(err)
	if !ok || s.Code() != codes.Unavailable {
		return false
	}
	msg := s.Message()
	return msg == "the connection is draining" ||
		strings.HasSuffix(msg, "RST_STREAM with error code: REFUSED_STREAM")
}
