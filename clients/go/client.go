// Package idemd is the Go client of idemd, idempotency keys as a service.
//
// A Client exposes the raw RPCs of idemd.v1.Idempotency (Claim, Complete,
// Fail, ExtendLease, Lookup, ListPending, Reconcile) with credentials and a
// default deadline applied, and the executor helper ExecuteOnce, which runs a
// handler at most once per idempotency key across retries, processes and
// machines. See docs/sdk.md in the idemd repository for the contract.
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
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

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

// WithCallTimeout sets the default per-call deadline (DefaultCallTimeout when
// not set; 0 disables it). A context deadline always takes precedence.
func WithCallTimeout(d time.Duration) Option { return func(o *clientOptions) { o.callTimeout = d } }

// WithDialOptions appends gRPC dial options (interceptors, keepalive, ...).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *clientOptions) { o.dialOptions = append(o.dialOptions, opts...) }
}

// New creates a client for target (host:port, or any gRPC target URI). By
// default it uses TLS with the system roots; see WithInsecure, WithCAFile and
// WithTLSConfig. Connecting is lazy: New does not wait for the server.
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
		if o.caFile != "" || o.tlsConfig != nil {
			return nil, errors.New("idemd: WithInsecure conflicts with WithCAFile/WithTLSConfig")
		}
		transport = insecure.NewCredentials()
	case o.tlsConfig != nil && o.caFile != "":
		return nil, errors.New("idemd: use either WithCAFile or WithTLSConfig, not both")
	case o.tlsConfig != nil:
		transport = credentials.NewTLS(o.tlsConfig)
	case o.caFile != "":
		pem, err := os.ReadFile(o.caFile)
		if err != nil {
			return nil, fmt.Errorf("idemd: reading CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("idemd: no PEM certificate in CA file %s", o.caFile)
		}
		transport = credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	default:
		transport = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12}) // system roots
	}

	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(transport),
		grpc.WithChainUnaryInterceptor(deadlineInterceptor(o.callTimeout)),
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
