// Package testserver starts a real idemd for tests, as
// clients/conformance/README.md says: port 0, a fresh data directory, the
// conformance policies and tokens, JSON logs on stderr (the bound address is
// read from the "idemd serving" line), SIGTERM at the end.
//
// The binary is $IDEMD_BIN, default <repo root>/target/debug/idemd.
package testserver

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

const startTimeout = 30 * time.Second

// Server is a running idemd process.
type Server struct {
	Addr string // host:port

	cmd     *exec.Cmd
	dataDir string
	exited  chan struct{}
	logTail *tail
}

// RepoRoot is the idemd repository root: the nearest directory above the
// working directory (go test runs in the package directory) that holds
// clients/conformance/scenarios.json.
func RepoRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "clients", "conformance", "scenarios.json")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			panic("testserver: no idemd repository above the working directory")
		}
		dir = parent
	}
}

// ConformanceDir is clients/conformance in the repository.
func ConformanceDir() string { return filepath.Join(RepoRoot(), "clients", "conformance") }

// Binary is the idemd binary the tests run.
func Binary() string {
	if bin := os.Getenv("IDEMD_BIN"); bin != "" {
		return bin
	}
	return filepath.Join(RepoRoot(), "target", "debug", "idemd")
}

// Start launches idemd with the conformance tokens and waits until it serves.
// extraArgs are appended to the command line.
func Start(extraArgs ...string) (*Server, error) { return start(true, extraArgs) }

// StartWithoutAuth launches idemd without a tokens file: the tenant then
// comes from the x-tenant-id header (development mode), or from the client
// certificate when extraArgs turn on mTLS (--tls-client-ca).
func StartWithoutAuth(extraArgs ...string) (*Server, error) { return start(false, extraArgs) }

func start(auth bool, extraArgs []string) (*Server, error) {
	bin := Binary()
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("idemd binary %s: %w (set IDEMD_BIN)", bin, err)
	}
	dataDir, err := os.MkdirTemp("", "idemd-go-sdk-*")
	if err != nil {
		return nil, err
	}
	conf := ConformanceDir()
	args := []string{
		"--listen", "127.0.0.1:0",
		"--data-dir", dataDir,
		"--config", filepath.Join(conf, "idemd.toml"),
	}
	if auth {
		args = append(args, "--auth-tokens", filepath.Join(conf, "tokens.txt"))
	}
	args = append(args, "--log-format", "json")
	args = append(args, extraArgs...)
	cmd := exec.Command(bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		os.RemoveAll(dataDir)
		return nil, err
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dataDir)
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	s := &Server{cmd: cmd, dataDir: dataDir, exited: make(chan struct{}), logTail: &tail{}}
	addrCh := make(chan string, 1)
	go func() {
		// Keep draining stderr for the server's whole life; remember the
		// address from the first "idemd serving" line.
		scanner := bufio.NewScanner(stderr)
		scanner.Buffer(make([]byte, 64*1024), 1024*1024)
		sent := false
		for scanner.Scan() {
			line := scanner.Bytes()
			s.logTail.add(string(line))
			if sent {
				continue
			}
			var entry struct {
				Message string `json:"message"`
				Address string `json:"address"`
			}
			if json.Unmarshal(line, &entry) == nil && entry.Message == "idemd serving" && entry.Address != "" {
				addrCh <- entry.Address
				sent = true
			}
		}
	}()
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	select {
	case s.Addr = <-addrCh:
		return s, nil
	case <-s.exited:
		os.RemoveAll(dataDir)
		return nil, fmt.Errorf("idemd exited before serving:\n%s", s.logTail.String())
	case <-time.After(startTimeout):
		s.Stop()
		return nil, fmt.Errorf("idemd did not report \"idemd serving\" within %s:\n%s", startTimeout, s.logTail.String())
	}
}

// Stop sends SIGTERM, waits for the process (SIGKILL after 10 s) and removes
// the data directory.
func (s *Server) Stop() error {
	defer os.RemoveAll(s.dataDir)
	select {
	case <-s.exited:
		return errors.New("idemd had already exited")
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
		return errors.New("idemd did not stop within 10s of SIGTERM")
	}
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		return fmt.Errorf("idemd exited with status %d:\n%s", code, s.logTail.String())
	}
	return nil
}

// TestCerts is $IDEMD_TEST_CERTS, the directory of the TLS tests'
// certificates (ca.pem, server.crt/key, alice.crt/key, bob.crt/key,
// client-tenants.txt). An error, never a silent skip, when it is not usable:
// the TLS options must be tested on every run.
func TestCerts() (string, error) {
	dir := os.Getenv("IDEMD_TEST_CERTS")
	if dir == "" {
		return "", errors.New("IDEMD_TEST_CERTS is not set: run `make test-certs` from the repository root " +
			"and set IDEMD_TEST_CERTS to the directory it writes ($CARGO_TARGET_DIR/test-certs, default target/test-certs)")
	}
	for _, name := range []string{"ca.pem", "server.crt", "server.key", "alice.crt", "alice.key",
		"bob.crt", "bob.key", "client-tenants.txt"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("IDEMD_TEST_CERTS=%s: %w (run `make test-certs`)", dir, err)
		}
	}
	return dir, nil
}

// MTLSArgs are the flags that make idemd serve TLS with the certificates in
// certs and require client certificates, whose SANs client-tenants.txt maps
// to tenants. Use them with StartWithoutAuth: the tenant then comes from the
// certificate alone.
func MTLSArgs(certs string) []string {
	return []string{
		"--tls-cert", filepath.Join(certs, "server.crt"),
		"--tls-key", filepath.Join(certs, "server.key"),
		"--tls-client-ca", filepath.Join(certs, "ca.pem"),
		"--tls-client-tenants", filepath.Join(certs, "client-tenants.txt"),
	}
}

var (
	shared     *Server
	sharedErr  error
	sharedOnce sync.Once
	sharedMu   sync.Mutex
)

// Shared returns the package's idemd, started on first use. Use Main in
// TestMain to stop it after the tests.
func Shared(t testing.TB) *Server {
	t.Helper()
	sharedOnce.Do(func() {
		sharedMu.Lock()
		defer sharedMu.Unlock()
		shared, sharedErr = Start()
	})
	if sharedErr != nil {
		t.Fatalf("starting idemd: %v", sharedErr)
	}
	return shared
}

// Main runs the tests and stops the shared server (if one was started).
func Main(m *testing.M) {
	code := m.Run()
	sharedMu.Lock()
	if shared != nil {
		if err := shared.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "testserver:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	sharedMu.Unlock()
	os.Exit(code)
}

// tail keeps the last lines of the server log for error messages.
type tail struct {
	mu    sync.Mutex
	lines []string
}

func (t *tail) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, line)
	if len(t.lines) > 50 {
		t.lines = t.lines[len(t.lines)-50:]
	}
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := ""
	for _, l := range t.lines {
		out += l + "\n"
	}
	return out
}

// Credential is the bearer token of tenant name (alice, bob) from the
// "credentials" of clients/conformance/scenarios.json.
func Credential(name string) (string, error) {
	data, err := os.ReadFile(filepath.Join(ConformanceDir(), "scenarios.json"))
	if err != nil {
		return "", err
	}
	var file struct {
		Credentials map[string]string `json:"credentials"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		return "", fmt.Errorf("scenarios.json: %w", err)
	}
	token, ok := file.Credentials[name]
	if !ok {
		return "", fmt.Errorf("no credential %q in scenarios.json", name)
	}
	return token, nil
}
