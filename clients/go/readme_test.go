package idemd_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

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
