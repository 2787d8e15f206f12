package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemd/idemd/clients/go/internal/testserver"
)

// TestReadmeConsumer is a user's consumer project: in an empty directory
// outside the repository, the README's Consumers install block runs as
// written (the checkout being a copy of the files git ships for
// clients/go), its program is saved as main.go, tidied and built, then run
// against the broker while one message is produced twice: the side effect
// runs once, the second delivery is a duplicate, SIGTERM exits 0.
func TestReadmeConsumer(t *testing.T) {
	e := scenarioEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root := testserver.RepoRoot()
	readme := filepath.Join(root, "clients", "go", "README.md")
	tmp := t.TempDir()
	if rel, err := filepath.Rel(root, tmp); err == nil && !strings.HasPrefix(rel, "..") {
		t.Fatalf("temporary directory %s is inside the repository %s: set TMPDIR elsewhere", tmp, root)
	}
	checkout := filepath.Join(tmp, "idemd")
	if err := testserver.CopyShippedFiles(root, "clients/go", checkout); err != nil {
		t.Fatal(err)
	}
	recipe, err := testserver.ReadmeBlock(readme, "sh", "franz-go@")
	if err != nil {
		t.Fatal(err)
	}
	const placeholder = "/path/to/idemd"
	if strings.Count(recipe, placeholder) != 1 {
		t.Fatalf("the Consumers install block should name the checkout as %s exactly once:\n%s", placeholder, recipe)
	}
	recipe = strings.Replace(recipe, placeholder, checkout, 1)
	data, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	_, section, found := strings.Cut(string(data), "## Consumers\n")
	program := regexp.MustCompile("(?s)```go\n(.*?)```").FindStringSubmatch(section)
	if !found || program == nil {
		t.Fatal("README.md has no ```go block under ## Consumers")
	}

	project := filepath.Join(tmp, "consumer")
	if err := os.Mkdir(project, 0o755); err != nil {
		t.Fatal(err)
	}
	// A user's shell: no workspace, no GOFLAGS of ours.
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir, cmd.Env = project, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	run("bash", "-euo", "pipefail", "-c", recipe)
	if err := os.WriteFile(filepath.Join(project, "main.go"), []byte(program[1]), 0o644); err != nil {
		t.Fatal(err)
	}
	run("go", "mod", "tidy")
	exe := filepath.Join(tmp, "consumer-program")
	run("go", "build", "-o", exe, ".")

	topic := "readme-" + randomHex(t)
	created, err := e.admin.CreateTopics(ctx, 1, 1, nil, topic)
	if err == nil {
		err = created.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	header := []kgo.RecordHeader{{Key: "idempotency-key", Value: []byte("order-" + randomHex(t))}}
	value := []byte(`{"amount":4200,"currency":"usd"}`)
	if err := e.kafka.ProduceSync(ctx,
		&kgo.Record{Topic: topic, Value: value, Headers: header},
		&kgo.Record{Topic: topic, Value: value, Headers: header}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "KAFKA_BROKERS="+e.brokers, "KAFKA_TOPIC="+topic,
		"IDEMD_ADDR="+e.idemdAddr, "IDEMD_TOKEN="+e.token)
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(out.String(), "duplicate") && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("the README consumer exited with %v after SIGTERM", err)
		}
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Errorf("the README consumer did not exit within 20 s of SIGTERM")
	}
	printed := out.String()
	if strings.Count(printed, "charged: ") != 1 || !strings.Contains(printed, "executed\n") ||
		!strings.Contains(printed, "duplicate\n") {
		t.Errorf("one message produced twice: want one charge, one executed and one duplicate; the program printed:\n%s", printed)
	}
}
