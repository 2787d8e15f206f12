package idemd_test

import (
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
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
