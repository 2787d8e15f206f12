package idemd_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemd/idemd/clients/go/internal/testserver"
)

// TestReadmeExample builds the README's Go program exactly as written and
// runs it twice against a live idemd with the same key: the first run
// executes, the second replays.
func TestReadmeExample(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```go\n(.*?)```").FindSubmatch(readme)
	if block == nil {
		t.Fatal("README.md has no ```go block")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	// Inside the module, so that the program imports this SDK; "_" keeps the
	// directory out of ./... patterns.
	dir, err := os.MkdirTemp(".", "_readme_example_")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "main.go"), block[1], 0o644); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(t.TempDir(), "readme-example")
	build := exec.Command(goBin, "build", "-o", exe, "./"+filepath.Base(dir))
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the README program: %v\n%s", err, out)
	}

	env := append(os.Environ(),
		"IDEMD_ADDR="+testserver.Shared(t).Addr,
		"IDEMD_TOKEN="+credential(t, "alice"),
		"IDEMPOTENCY_KEY="+newKey(t),
	)
	for _, want := range []string{
		`201 {"id":"pay_1"} replayed: false`,
		`201 {"id":"pay_1"} replayed: true`,
	} {
		run := exec.Command(exe)
		run.Env = env
		out, err := run.CombinedOutput()
		if err != nil {
			t.Fatalf("running the README program: %v\n%s", err, out)
		}
		if got := strings.TrimSpace(string(out)); got != want {
			t.Errorf("README program printed %q, want %q", got, want)
		}
	}
}

// TestReadmeMiddlewareExample builds the README's middleware program as
// written, serves it and posts one payment twice: the second is a replay.
func TestReadmeMiddlewareExample(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, found := strings.Cut(string(readme), "## HTTP middleware\n")
	block := regexp.MustCompile("(?s)```go\n(.*?)```").FindStringSubmatch(section)
	if !found || block == nil {
		t.Fatal("README.md has no ```go block under ## HTTP middleware")
	}
	dir, err := os.MkdirTemp(".", "_readme_middleware_")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(block[1]), 0o644); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(t.TempDir(), "readme-middleware")
	if out, err := exec.Command("go", "build", "-o", exe, "./"+filepath.Base(dir)).CombinedOutput(); err != nil {
		t.Fatalf("building the README middleware program: %v\n%s", err, out)
	}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := listener.Addr().String()
	listener.Close()
	run := exec.Command(exe)
	run.Env = append(os.Environ(), "IDEMD_ADDR="+testserver.Shared(t).Addr,
		"IDEMD_TOKEN="+credential(t, "alice"), "LISTEN="+addr)
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = run.Process.Kill(); _ = run.Wait() })
	key := newKey(t)
	post := func() *http.Response {
		for attempt := 0; ; attempt++ {
			req, _ := http.NewRequest("POST", "http://"+addr+"/v1/payments/p1", strings.NewReader("{}"))
			req.Header.Set("Idempotency-Key", key)
			res, err := http.DefaultClient.Do(req)
			if err == nil {
				return res
			}
			if attempt > 100 {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // still starting
		}
	}
	first, again := post(), post()
	firstBody, _ := io.ReadAll(first.Body)
	againBody, _ := io.ReadAll(again.Body)
	first.Body.Close()
	again.Body.Close()
	if first.StatusCode != 201 || first.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %d %v %s", first.StatusCode, first.Header, firstBody)
	}
	if again.StatusCode != 201 || again.Header.Get("Idempotent-Replayed") != "true" || string(againBody) != string(firstBody) {
		t.Fatalf("retry: %d %v %s", again.StatusCode, again.Header, againBody)
	}
}

// connectProxy is an HTTP CONNECT proxy on loopback that counts its tunnels
// and remembers their targets.
type connectProxy struct {
	addr    string
	mu      sync.Mutex
	targets []string
}

func startConnectProxy(t *testing.T) *connectProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	p := &connectProxy{addr: l.Addr().String()}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go p.serve(conn)
		}
	}()
	return p
}

func (p *connectProxy) serve(conn net.Conn) {
	defer conn.Close()
	br := bufio.NewReader(conn)
	req, err := http.ReadRequest(br)
	if err != nil || req.Method != http.MethodConnect {
		return
	}
	// The tests name the target "localhost." (Go never proxies "localhost"),
	// which the system resolver need not know: a proxy resolves it as the
	// name it is, without the root's dot.
	host, port, err := net.SplitHostPort(req.Host)
	if err != nil {
		_, _ = io.WriteString(conn, "HTTP/1.1 400 Bad Request\r\n\r\n")
		return
	}
	upstream, err := net.Dial("tcp", net.JoinHostPort(strings.TrimSuffix(host, "."), port))
	if err != nil {
		_, _ = io.WriteString(conn, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
		return
	}
	defer upstream.Close()
	p.mu.Lock()
	p.targets = append(p.targets, req.Host)
	p.mu.Unlock()
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	go func() { _, _ = io.Copy(upstream, br); upstream.(*net.TCPConn).CloseWrite() }()
	_, _ = io.Copy(conn, upstream)
}

func (p *connectProxy) tunnels() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.targets...)
}

// TestReadmeProxyExample builds the README's program for an ingress with TLS
// as written and runs it against idemd behind nginx's tls profile
// (scripts/nginx.sh): first directly, then through an HTTP CONNECT proxy
// named by HTTPS_PROXY, which grpc-go must use (the target's host is
// "localhost.", since Go never proxies localhost itself).
func TestReadmeProxyExample(t *testing.T) {
	t.Parallel()
	certs, err := testserver.TestCerts()
	if err != nil {
		t.Fatal(err)
	}
	block, err := testserver.ReadmeBlock("README.md", "go", "IDEMD_CA_FILE")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(".", "_readme_proxy_")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(block), 0o644); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(t.TempDir(), "readme-proxy")
	if out, err := exec.Command("go", "build", "-o", exe, "./"+filepath.Base(dir)).CombinedOutput(); err != nil {
		t.Fatalf("building the README proxy program: %v\n%s", err, out)
	}
	ingress := startNginx(t, testserver.Shared(t).Addr, "tls", certs)
	_, port, err := net.SplitHostPort(ingress.addr)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startConnectProxy(t)
	var base []string
	for _, kv := range os.Environ() {
		switch strings.ToUpper(strings.SplitN(kv, "=", 2)[0]) {
		case "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "GRPC_PROXY":
			continue
		}
		base = append(base, kv)
	}
	base = append(base, "IDEMD_CA_FILE="+filepath.Join(certs, "ca.pem"), "IDEMD_TOKEN="+credential(t, "alice"),
		"IDEMPOTENCY_KEY="+newKey(t))
	runs := []struct {
		env  []string
		want string
	}{
		{[]string{"IDEMD_ADDR=localhost:" + port}, `201 {"order":"ord_1"} replayed: false`},
		{[]string{"IDEMD_ADDR=localhost.:" + port, "HTTPS_PROXY=http://" + proxy.addr}, `201 {"order":"ord_1"} replayed: true`},
	}
	for i, r := range runs {
		run := exec.Command(exe)
		run.Env = append(append([]string(nil), base...), r.env...)
		out, err := run.CombinedOutput()
		if err != nil {
			t.Fatalf("run %d of the README proxy program: %v\n%s", i+1, err, out)
		}
		if got := strings.TrimSpace(string(out)); got != r.want {
			t.Errorf("run %d printed %q, want %q", i+1, got, r.want)
		}
	}
	if got := proxy.tunnels(); len(got) == 0 || got[0] != "localhost.:"+port {
		t.Errorf("CONNECT tunnels %q, want one to localhost.:%s (HTTPS_PROXY not honoured)", got, port)
	}
}
