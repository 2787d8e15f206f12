package idemd_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	idemd "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/clients/go/internal/testserver"
)

// consumerProgram is a user's first program: execute, replay, then the same
// key with a different body.
const consumerProgram = `package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	idemd "github.com/idemd/idemd/clients/go"
)

func main() {
	client, err := idemd.New(os.Getenv("IDEMD_ADDR"), idemd.WithToken(os.Getenv("IDEMD_TOKEN")), idemd.WithInsecure())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	calls := 0
	charge := func(ctx context.Context, ex idemd.Execution) (*idemd.Response, error) {
		calls++
		return &idemd.Response{Status: 201, Body: []byte("{\"id\":\"pay_1\"}")}, nil
	}
	for _, body := range []string{"{\"amount\":4200}", "{\"amount\":4200}", "{\"amount\":9900}"} {
		req := idemd.HTTPRequest{Method: "POST", Path: "/v1/payments", ContentType: "application/json", Body: []byte(body)}
		res, err := client.ExecuteOnce(context.Background(), "POST /v1/payments", os.Getenv("IDEMPOTENCY_KEY"), req, charge)
		var reuse *idemd.KeyReuseError
		switch {
		case errors.As(err, &reuse):
			fmt.Println("key reuse:", reuse.HTTPStatus, reuse.ErrorCode, "handler calls:", calls)
		case err != nil:
			log.Fatal(err)
		default:
			fmt.Println(res.Response.Status, string(res.Response.Body), "replayed:", res.Replayed, "handler calls:", calls)
		}
	}
}
`

// The placeholder of the README's local-checkout recipe.
const checkoutPlaceholder = "/path/to/idemd"

// TestConsumerModule is a throwaway user project (issues 12 and 37): in an
// empty directory outside the repository, README.md's Install block (its sh
// block with "-replace=") runs as written, with the checkout's path for the
// placeholder: it makes the module, requires the SDK from the checkout,
// writes a program importing it, tidies (resolving the dependencies through
// the module proxy) and runs it. Then consumerProgram replaces that program
// and runs against a live idemd. The "checkout" is a copy of
// exactly the files git would ship for clients/go (tracked, plus untracked
// and not ignored), so a file that is ignored but exists here, like stubs
// generated locally, cannot hide a packaging defect.
//
// A Go test rather than a test.sh step, so that it shares the suite's idemd
// (testserver: address from the log, SIGTERM, the log tail on failure) and
// runs alongside the other tests. It needs git, and the module proxy unless
// the module cache already holds the dependencies.
func TestConsumerModule(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root := testserver.RepoRoot()
	tmp := t.TempDir()
	if rel, err := filepath.Rel(root, tmp); err == nil && !strings.HasPrefix(rel, "..") {
		t.Fatalf("temporary directory %s is inside the repository %s: set TMPDIR elsewhere", tmp, root)
	}
	checkout := filepath.Join(tmp, "idemd")
	if err := testserver.CopyShippedFiles(root, "clients/go", checkout); err != nil {
		t.Fatal(err)
	}

	recipe, err := testserver.ReadmeBlock("README.md", "sh", "-replace=")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(recipe, checkoutPlaceholder) != 1 {
		t.Fatalf("the README's replace recipe should name the checkout as %s exactly once:\n%s", checkoutPlaceholder, recipe)
	}
	recipe = strings.Replace(recipe, checkoutPlaceholder, checkout, 1)

	consumer := filepath.Join(tmp, "consumer")
	if err := os.Mkdir(consumer, 0o755); err != nil {
		t.Fatal(err)
	}
	// A user's shell: no workspace, no GOFLAGS of ours; the proxy settings
	// and the toolchain (PATH, GOTOOLCHAIN) are inherited.
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = consumer
		cmd.Env = env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
		}
		return out.String()
	}
	printed := strings.Split(strings.TrimSpace(run("bash", "-euo", "pipefail", "-c", recipe)), "\n")
	if got, want := printed[len(printed)-1], idemd.DownstreamKey("order-1", "charge"); got != want {
		t.Fatalf("the Install block's program printed %q last, want %q", got, want)
	}
	if err := os.WriteFile(filepath.Join(consumer, "main.go"), []byte(consumerProgram), 0o644); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(tmp, "consumer-program")
	run("go", "build", "-o", exe, ".")

	env = append(env,
		"IDEMD_ADDR="+testserver.Shared(t).Addr,
		"IDEMD_TOKEN="+credential(t, "alice"),
		"IDEMPOTENCY_KEY="+newKey(t),
	)
	got := strings.TrimSpace(run(exe))
	want := strings.Join([]string{
		`201 {"id":"pay_1"} replayed: false handler calls: 1`,
		`201 {"id":"pay_1"} replayed: true handler calls: 1`,
		`key reuse: 422 idempotency_key_reuse handler calls: 1`,
	}, "\n")
	if got != want {
		t.Errorf("the consumer program printed\n%s\nwant\n%s", got, want)
	}
}
