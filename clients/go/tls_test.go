package idemd_test

// The SDK's TLS options against idemd's own TLS with required client
// certificates (clients/conformance/README.md, "TLS and mTLS").

import (
	"context"
	"crypto/tls"
	"errors"
	"io/fs"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	idemd "github.com/idemd/idemd/clients/go"
	idemdv1 "github.com/idemd/idemd/clients/go/gen/idemd/v1"
	"github.com/idemd/idemd/clients/go/internal/testserver"
)

// refusedTimeout bounds the calls that must fail: a refused handshake must
// not be mistaken for a hang, and 5 s is far above a local handshake even on
// a loaded machine.
const refusedTimeout = 5 * time.Second

func TestMTLS(t *testing.T) {
	t.Parallel()
	certs, err := testserver.TestCerts()
	if err != nil {
		t.Fatal(err)
	}
	cert := func(name string) string { return filepath.Join(certs, name) }
	srv, err := testserver.StartWithoutAuth(testserver.MTLSArgs(certs)...)
	if err != nil {
		t.Fatalf("starting idemd with TLS: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Error(err)
		}
	})
	// The server certificate names localhost, not the address idemd reports.
	_, port, err := net.SplitHostPort(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	target := net.JoinHostPort("localhost", port)
	connect := func(opts ...idemd.Option) *idemd.Client {
		t.Helper()
		c, err := idemd.New(target, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	alice := connect(idemd.WithCAFile(cert("ca.pem")), idemd.WithClientCertificate(cert("alice.crt"), cert("alice.key")))
	key := newKey(t)

	t.Run("alice executes once then replays", func(t *testing.T) {
		var calls atomic.Int32
		handler := func(context.Context, idemd.Execution) (*idemd.Response, error) {
			calls.Add(1)
			return created(`{"id":"pay_mtls"}`), nil
		}
		first, err := alice.ExecuteOnce(context.Background(), paymentsEndpoint, key, payment, handler)
		if err != nil {
			t.Fatalf("first execute over mTLS: %v", err)
		}
		if first.Replayed || calls.Load() != 1 || string(first.Response.Body) != `{"id":"pay_mtls"}` {
			t.Fatalf("first execute: %+v after %d handler calls; want executed once", first, calls.Load())
		}
		second, err := alice.ExecuteOnce(context.Background(), paymentsEndpoint, key, payment, handler)
		if err != nil {
			t.Fatalf("second execute over mTLS: %v", err)
		}
		if !second.Replayed || calls.Load() != 1 || string(second.Response.Body) != `{"id":"pay_mtls"}` {
			t.Errorf("second execute: %+v after %d handler calls; want replayed", second, calls.Load())
		}
	})

	t.Run("the tenant comes from the certificate", func(t *testing.T) {
		bob := connect(idemd.WithCAFile(cert("ca.pem")), idemd.WithClientCertificate(cert("bob.crt"), cert("bob.key")))
		if got := lookupState(t, bob, paymentsEndpoint, key); got != "NOT_FOUND" {
			t.Errorf("bob looks up alice's key: %s, want NOT_FOUND", got)
		}
		// Without this, NOT_FOUND could also mean the key was never stored.
		if got := lookupState(t, alice, paymentsEndpoint, key); got != "COMPLETED" {
			t.Errorf("alice looks up her key: %s, want COMPLETED", got)
		}
	})

	refused := func(t *testing.T, c *idemd.Client) {
		t.Helper()
		_, err := c.Lookup(context.Background(), &idemdv1.LookupRequest{Endpoint: paymentsEndpoint, Key: key})
		// UNAVAILABLE is the client's own verdict on the connection; any
		// other code would be an answer from the service.
		if status.Code(err) != codes.Unavailable {
			t.Errorf("err = %v, want UNAVAILABLE (no answer from the service)", err)
		}
		t.Logf("refused as expected: %v", err)
	}

	t.Run("no client certificate", func(t *testing.T) {
		refused(t, connect(idemd.WithCAFile(cert("ca.pem")), idemd.WithCallTimeout(refusedTimeout)))
	})

	t.Run("plaintext", func(t *testing.T) {
		refused(t, connect(idemd.WithInsecure(), idemd.WithCallTimeout(refusedTimeout)))
	})

	t.Run("server not trusted by the system roots", func(t *testing.T) {
		refused(t, connect(idemd.WithClientCertificate(cert("alice.crt"), cert("alice.key")),
			idemd.WithCallTimeout(refusedTimeout)))
	})
}

func TestTLSOptionConflicts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	missingCert, missingKey := filepath.Join(dir, "missing.crt"), filepath.Join(dir, "missing.key")
	for _, tc := range []struct {
		name string
		opts []idemd.Option
		want string
	}{
		{"client certificate with insecure",
			[]idemd.Option{idemd.WithInsecure(), idemd.WithClientCertificate(missingCert, missingKey)}, "WithInsecure"},
		{"client certificate with TLS config",
			[]idemd.Option{idemd.WithTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12}),
				idemd.WithClientCertificate(missingCert, missingKey)}, "WithTLSConfig"},
		{"CA file with insecure",
			[]idemd.Option{idemd.WithCAFile(filepath.Join(dir, "ca.pem")), idemd.WithInsecure()}, "WithInsecure"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := idemd.New("localhost:1", tc.opts...)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to name %s", err, tc.want)
			}
		})
	}
	t.Run("missing client certificate file", func(t *testing.T) {
		_, err := idemd.New("localhost:1", idemd.WithClientCertificate(missingCert, missingKey))
		if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "client certificate") {
			t.Errorf("err = %v, want a not-exist error about the client certificate", err)
		}
	})
}
