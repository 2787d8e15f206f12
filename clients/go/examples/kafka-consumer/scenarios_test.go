package main

// The runner of clients/conformance/consumer-scenarios.json: every scenario
// against the broker of $IDEMD_TEST_KAFKA_BROKERS and a live idemd, the
// consumers being this program run as separate processes, as
// consumer-scenarios.md says.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemd/idemd/clients/go/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

const scenarioBound = 60 * time.Second

type consumerFile struct {
	Version     int              `json:"version"`
	Description string           `json:"description"`
	Defaults    scenarioSettings `json:"defaults"`
	Scenarios   []scenario       `json:"scenarios"`
}

type scenarioSettings struct {
	Partitions int    `json:"partitions"`
	KeyHeader  string `json:"key_header"`
	Lease      string `json:"lease"`
	HandlerMS  *int   `json:"handler_ms"`
	// Mode is the consumer program's -mode (sequential when empty), and
	// Parallelism its -parallelism (the helper's default when 0).
	Mode        string `json:"-"`
	Parallelism int    `json:"-"`
}

type scenario struct {
	Name string `json:"name"`
	scenarioSettings
	Produce struct {
		Messages                  int   `json:"messages"`
		DuplicateEvery            int   `json:"duplicate_every"`
		DuplicateToOtherPartition bool  `json:"duplicate_to_other_partition"`
		Poison                    []int `json:"poison"`
	} `json:"produce"`
	Consumers       []consumerEntry `json:"consumers"`
	NegativeControl bool            `json:"negative_control"`
	Expect          struct {
		SideEffects string `json:"side_effects"`
		DeadLetters []struct {
			Message        int    `json:"message"`
			ReasonIncludes string `json:"reason_includes"`
		} `json:"dead_letters"`
		DuplicatesSkippedAtLeast int `json:"duplicates_skipped_at_least"`
	} `json:"expect"`
}

type consumerEntry struct {
	Name                           string `json:"name"`
	StartAfterSideEffects          int    `json:"start_after_side_effects"`
	StartAfterExitOf               string `json:"start_after_exit_of"`
	StopAfterSideEffects           int    `json:"stop_after_side_effects"`
	KillAfterSideEffectOf          int    `json:"kill_after_side_effect_of"`
	KillInHandlerAfterSideEffectOf int    `json:"kill_in_handler_after_side_effect_of"`
}

// loadConsumerScenarios reads the file strictly: a field this runner does
// not know fails the suite instead of being ignored.
func loadConsumerScenarios(t *testing.T) consumerFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testserver.ConformanceDir(), "consumer-scenarios.json"))
	if err != nil {
		t.Fatal(err)
	}
	var file consumerFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&file); err != nil {
		t.Fatalf("consumer-scenarios.json: %v", err)
	}
	if file.Version != 1 || len(file.Scenarios) == 0 {
		t.Fatalf("consumer-scenarios.json: version %d with %d scenarios", file.Version, len(file.Scenarios))
	}
	for _, s := range file.Scenarios {
		if e := s.Expect.SideEffects; e != "each_once" && e != "each_once_except_poison" {
			t.Fatalf("consumer-scenarios.json: %q: unknown side_effects %q", s.Name, e)
		}
	}
	return file
}

// brokers is $IDEMD_TEST_KAFKA_BROKERS. test.sh sets
// IDEMD_TEST_KAFKA_REQUIRED: a suite that skips there would hide a broken
// setup; a developer running go test alone may skip.
func brokers(t *testing.T) string {
	t.Helper()
	b := os.Getenv("IDEMD_TEST_KAFKA_BROKERS")
	if b == "" {
		msg := "IDEMD_TEST_KAFKA_BROKERS is not set: run under scripts/kafka.sh run -- (clients/go/test.sh does)"
		if os.Getenv("IDEMD_TEST_KAFKA_REQUIRED") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return b
}

func randomHex(t *testing.T) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// buildConsumer builds this program once per test binary.
var buildConsumer = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "kafka-consumer-")
	if err != nil {
		return "", err
	}
	exe := filepath.Join(dir, "kafka-consumer")
	if out, err := exec.Command("go", "build", "-o", exe, ".").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return exe, nil
})

// stallBound is how much longer than without the helper a consumer killed
// inside its handler may hold its partition with the helper's defaults
// (issue 52: at most about DefaultConsumerLease).
const stallBound = 5 * time.Second

// scenarioParallelism is the program's -parallelism in the pipelined and
// parallel modes.
const scenarioParallelism = 4

// consumerModes are the program's -mode values every scenario is played
// in (consumer-scenarios.md, "Modes"); IDEMD_CONSUMER_MODES narrows them.
func consumerModes() []string {
	if modes := strings.Fields(os.Getenv("IDEMD_CONSUMER_MODES")); len(modes) > 0 {
		return modes
	}
	return []string{"sequential", "pipelined", "parallel"}
}

func TestConsumerScenarios(t *testing.T) {
	file := loadConsumerScenarios(t)
	env := scenarioEnv(t)
	for _, mode := range consumerModes() {
		t.Run(mode, func(t *testing.T) { playAll(t, env, file, mode) })
	}
}

func playAll(t *testing.T, env *env, file consumerFile, mode string) {
	for i, s := range file.Scenarios {
		t.Run(s.Name, func(t *testing.T) {
			settings := s.resolve(file.Defaults)
			settings.Mode = mode
			started := time.Now()
			if mode != "sequential" {
				// Fewer in flight than a scenario's poll, so that a helper
				// claiming more than its window would show (the crash bound).
				settings.Parallelism = scenarioParallelism
			}
			problems, stall, err := env.play(t, i, s, settings, false)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range problems {
				t.Error(p)
			}
			// The negative control runs no helper, so one mode plays it.
			if !s.NegativeControl || t.Failed() || mode != consumerModes()[0] {
				return
			}
			withHelper := time.Since(started)
			started = time.Now()
			problems, bareStall, err := env.play(t, i, s, settings, true)
			if err != nil {
				t.Fatalf("negative control: %v", err)
			}
			// What the helper costs a scenario with a kill: the wait for the
			// dead consumer's lease beside the group's own session timeout.
			without := time.Since(started)
			t.Logf("played in %v with the helper, %v without: %.2fx", withHelper.Round(time.Millisecond),
				without.Round(time.Millisecond), withHelper.Seconds()/without.Seconds())
			if withHelper.Seconds() > 1.3*without.Seconds() {
				t.Errorf("the helper made the scenario %.2fx slower (bound 1.3x)", withHelper.Seconds()/without.Seconds())
			}
			// A kill inside a handler: the partition waits for the group to
			// notice (the session timeout, as without the helper), then for
			// the dead consumer's lease: with the defaults (5 s, extended at
			// half) that wait is over by the time the group has noticed.
			if stall > 0 || bareStall > 0 {
				t.Logf("partition stalled %v after the kill with the helper, %v without (the group's session timeout); the helper's share %v",
					stall.Round(time.Millisecond), bareStall.Round(time.Millisecond), (stall - bareStall).Round(time.Millisecond))
				if stall == 0 || bareStall == 0 {
					t.Errorf("the killed message was not decided again in both runs (stall %v with the helper, %v without)", stall, bareStall)
				} else if stall-bareStall > stallBound {
					t.Errorf("the helper stalled the partition %v beyond the group's own %v (bound %v)", stall-bareStall, bareStall, stallBound)
				}
			}
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, "side effect ran") }) {
				t.Errorf("negative control: without the helper the scenario should repeat a side effect; problems: %q", problems)
			}
		})
	}
}

// env is what every scenario shares.
type env struct {
	brokers, idemdAddr, token, exe string
	kafka                          *kgo.Client
	admin                          *kadm.Client
}

func scenarioEnv(t *testing.T) *env {
	t.Helper()
	e := &env{brokers: brokers(t), idemdAddr: testserver.Shared(t).Addr}
	var err error
	if e.token, err = testserver.Credential("alice"); err != nil {
		t.Fatal(err)
	}
	if e.exe, err = buildConsumer(); err != nil {
		t.Fatal(err)
	}
	e.kafka, err = kgo.NewClient(kgo.SeedBrokers(strings.Split(e.brokers, ",")...),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.kafka.Close)
	e.admin = kadm.NewClient(e.kafka)
	return e
}

func (s scenario) resolve(d scenarioSettings) scenarioSettings {
	r := d
	if s.Partitions > 0 {
		r.Partitions = s.Partitions
	}
	if s.KeyHeader != "" {
		r.KeyHeader = s.KeyHeader
	}
	if s.Lease != "" {
		r.Lease = s.Lease
	}
	if s.HandlerMS != nil {
		r.HandlerMS = s.HandlerMS
	}
	if r.HandlerMS == nil {
		r.HandlerMS = new(int)
	}
	return r
}

// play runs scenario index once (noHelper: the negative control) and
// returns what its expect found wrong; err is a failure to run it at all.
func (e *env) play(t *testing.T, index int, s scenario, set scenarioSettings, noHelper bool) ([]string, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*scenarioBound)
	defer cancel()
	prefix := randomHex(t)
	topic := fmt.Sprintf("consumer-%s-%d", prefix, index)
	group := "group-" + topic
	dir := t.TempDir()
	ledger, dead := filepath.Join(dir, "ledger"), filepath.Join(dir, "dead-letters")
	started := filepath.Join(dir, "started")

	created, err := e.admin.CreateTopics(ctx, int32(set.Partitions), 1, nil, topic)
	if err == nil {
		err = created.Error()
	}
	if err != nil {
		return nil, 0, fmt.Errorf("creating %s: %w", topic, err)
	}
	if err := e.produce(ctx, s, set, topic, prefix); err != nil {
		return nil, 0, err
	}

	procs := make([]*consumerProc, len(s.Consumers))
	stopSent := make([]bool, len(s.Consumers))
	defer func() {
		for _, p := range procs {
			if p != nil {
				p.kill()
			}
		}
	}()
	latest := func(name string, before int) *consumerProc {
		for j := before - 1; j >= 0; j-- {
			if s.Consumers[j].Name == name {
				return procs[j]
			}
		}
		return nil
	}
	deadline := time.Now().Add(scenarioBound)
	// The partition's stall after a kill inside a handler: from the moment
	// the killed consumer is seen gone to the moment its message is decided
	// again (dead-lettered with the helper, its side effect repeated without),
	// both seen by this loop's 200 ms polls.
	killed, killedAt, stall := 0, time.Time{}, time.Duration(0)
	for {
		sideEffects := readLedger(ledger)
		if killed > 0 && stall == 0 && (slices.ContainsFunc(readDeadLetters(dead), func(d deadLetter) bool { return d.Message == killed }) ||
			count(sideEffects, killed) > 1) {
			stall = time.Since(killedAt)
		}
		for i, c := range s.Consumers {
			if procs[i] != nil && killed == 0 && c.KillInHandlerAfterSideEffectOf > 0 && procs[i].hasExited() {
				killed, killedAt = c.KillInHandlerAfterSideEffectOf, time.Now()
			}
			if procs[i] != nil {
				if c.StopAfterSideEffects > 0 && !stopSent[i] && len(sideEffects) >= c.StopAfterSideEffects {
					procs[i].terminate()
					stopSent[i] = true
				}
				continue
			}
			ready := len(sideEffects) >= c.StartAfterSideEffects
			if c.StartAfterExitOf != "" {
				prev := latest(c.StartAfterExitOf, i)
				ready = ready && prev != nil && prev.hasExited()
			}
			if ready {
				if procs[i], err = e.start(c, set, topic, group, ledger, dead, noHelper, started); err != nil {
					return nil, 0, err
				}
			}
		}
		if accounted(s, sideEffects, readDeadLetters(dead)) && e.committedToEnd(ctx, group, topic) {
			break
		}
		if time.Now().After(deadline) {
			return nil, 0, fmt.Errorf("not done within %s: %d side effects, %d dead letters of %d messages%s",
				scenarioBound, len(sideEffects), len(readDeadLetters(dead)), s.Produce.Messages, describe(procs, s))
		}
		time.Sleep(200 * time.Millisecond)
	}
	var problems []string
	for i, p := range procs {
		if p == nil {
			continue
		}
		p.terminate()
		code, signalled := p.wait(20 * time.Second)
		killable := s.Consumers[i].KillAfterSideEffectOf > 0 || s.Consumers[i].KillInHandlerAfterSideEffectOf > 0
		if code != 0 && !(signalled && killable) {
			problems = append(problems, fmt.Sprintf("consumer %s exited with %d (signalled %v)\n%s",
				s.Consumers[i].Name, code, signalled, p.stderr()))
		}
	}
	mode := "helper"
	if noHelper {
		mode = "no helper"
	}
	for i, p := range procs {
		if p != nil {
			summary := "killed"
			if _, line, ok := strings.Cut(p.stdout(), "summary "); ok {
				summary = strings.TrimSpace(line)
			}
			t.Logf("%s: consumer %s: %s", mode, s.Consumers[i].Name, summary)
		}
	}
	problems = append(problems, check(t, s, set.Mode, readLedger(ledger), readDeadLetters(dead), readLedger(started), procs)...)
	if noHelper {
		t.Logf("no helper: %d problems, e.g. %q", len(problems), problems[:min(len(problems), 3)])
	}
	return problems, stall, nil
}

func (e *env) produce(ctx context.Context, s scenario, set scenarioSettings, topic, prefix string) error {
	parts := set.Partitions
	var records []*kgo.Record
	for n := 1; n <= s.Produce.Messages; n++ {
		value, _ := json.Marshal(map[string]any{"n": n, "poison": slices.Contains(s.Produce.Poison, n), "amount": 100})
		rec := func(partition int) *kgo.Record {
			return &kgo.Record{Topic: topic, Partition: int32(partition), Value: value,
				Headers: []kgo.RecordHeader{{Key: set.KeyHeader, Value: []byte(prefix + "-" + strconv.Itoa(n))}}}
		}
		records = append(records, rec(n%parts))
		if k := s.Produce.DuplicateEvery; k > 0 && n%k == 0 {
			if s.Produce.DuplicateToOtherPartition {
				records = append(records, rec((n+1)%parts))
			} else {
				records = append(records, rec(n%parts))
			}
		}
	}
	return e.kafka.ProduceSync(ctx, records...).FirstErr()
}

// committedToEnd: the group's committed offset of every partition is its
// end offset.
func (e *env) committedToEnd(ctx context.Context, group, topic string) bool {
	ends, err := e.admin.ListEndOffsets(ctx, topic)
	if err != nil || ends.Error() != nil {
		return false
	}
	committed, err := e.admin.FetchOffsets(ctx, group)
	if err != nil || committed.Error() != nil {
		return false
	}
	done := true
	ends.Each(func(o kadm.ListedOffset) {
		c, ok := committed.Lookup(topic, o.Partition)
		if o.Offset > 0 && (!ok || c.At < o.Offset) {
			done = false
		}
	})
	return done
}

// count is how many times n appears in xs.
func count(xs []int, n int) int {
	c := 0
	for _, x := range xs {
		if x == n {
			c++
		}
	}
	return c
}

func accounted(s scenario, sideEffects []int, dead []deadLetter) bool {
	seen := map[int]bool{}
	for _, n := range sideEffects {
		seen[n] = true
	}
	for _, d := range dead {
		seen[d.Message] = true
	}
	for n := 1; n <= s.Produce.Messages; n++ {
		if !seen[n] {
			return false
		}
	}
	return true
}

// check is the scenario's expect against what the consumers left.
// check compares what a play left with the scenario's expect. In the
// pipelined and parallel modes a kill inside a handler may also park the
// other messages then in flight (consumer-scenarios.md, "Modes"): a dead
// letter beyond the expected ones is allowed only with an "unknown" reason,
// and at most scenarioParallelism-1 of them (the window in flight beside
// the killed handler). Whether each had entered its handler is logged: a
// sibling's kill can land between a granted claim and its handler's first
// instruction.
func check(t *testing.T, s scenario, mode string, sideEffects []int, dead []deadLetter, started []int, procs []*consumerProc) []string {
	var problems []string
	counts := map[int]int{}
	for _, n := range sideEffects {
		counts[n]++
	}
	wantDead := map[int]string{}
	for _, d := range s.Expect.DeadLetters {
		wantDead[d.Message] = d.ReasonIncludes
	}
	gotDead := map[int]bool{}
	parkedBeside := map[int]bool{}
	for _, d := range dead {
		gotDead[d.Message] = true
		include, ok := wantDead[d.Message]
		batchMode := mode == "pipelined" || mode == "parallel"
		parked := strings.Contains(strings.ToLower(d.Reason), "unknown")
		switch {
		case !ok && batchMode && parked:
			// In flight beside the killed handler.
			if !parkedBeside[d.Message] {
				t.Logf("%s: message %d parked beside the killed handler (handler entered: %v)", mode, d.Message,
					slices.Contains(started, d.Message))
			}
			parkedBeside[d.Message] = true
		case !ok:
			problems = append(problems, fmt.Sprintf("message %d dead-lettered unexpectedly: %q", d.Message, d.Reason))
		case !strings.Contains(strings.ToLower(d.Reason), strings.ToLower(include)):
			problems = append(problems, fmt.Sprintf("message %d dead-lettered with %q, want it to include %q", d.Message, d.Reason, include))
		}
	}
	for n := 1; n <= s.Produce.Messages; n++ {
		want := 1
		if s.Expect.SideEffects == "each_once_except_poison" && slices.Contains(s.Produce.Poison, n) {
			want = 0
		}
		switch got := counts[n]; {
		case got > want:
			problems = append(problems, fmt.Sprintf("message %d: side effect ran %d times, want %d", n, got, want))
		case got < want && parkedBeside[n]:
			// Claimed beside the killed handler and parked before its
			// handler ran: dead-lettered instead, never run twice.
		case got < want:
			problems = append(problems, fmt.Sprintf("message %d: side effect missing", n))
		}
	}
	if len(parkedBeside) > scenarioParallelism-1 {
		problems = append(problems, fmt.Sprintf("%d messages parked beside the killed handler, more than the %d others a window of %d holds",
			len(parkedBeside), scenarioParallelism-1, scenarioParallelism))
	}
	for n := range wantDead {
		if !gotDead[n] {
			problems = append(problems, fmt.Sprintf("message %d was not dead-lettered", n))
		}
	}
	duplicates := 0
	for _, p := range procs {
		if p != nil {
			duplicates += strings.Count(p.stdout(), "outcome=duplicate ")
		}
	}
	if duplicates < s.Expect.DuplicatesSkippedAtLeast {
		problems = append(problems, fmt.Sprintf("%d duplicates skipped, want at least %d", duplicates, s.Expect.DuplicatesSkippedAtLeast))
	}
	return problems
}

func readLedger(path string) []int {
	data, _ := os.ReadFile(path)
	var out []int
	for line := range strings.Lines(string(data)) {
		if n, err := strconv.Atoi(strings.TrimSpace(line)); err == nil {
			out = append(out, n)
		}
	}
	return out
}

type deadLetter struct {
	Message int    `json:"message"`
	Reason  string `json:"reason"`
}

func readDeadLetters(path string) []deadLetter {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []deadLetter
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		var d deadLetter
		if json.Unmarshal(scanner.Bytes(), &d) == nil {
			out = append(out, d)
		}
	}
	return out
}

// consumerProc is one consumer process.
type consumerProc struct {
	cmd      *exec.Cmd
	out, err lockedBuffer
	exited   chan struct{}
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (e *env) start(c consumerEntry, set scenarioSettings, topic, group, ledger, dead string, noHelper bool,
	started string) (*consumerProc, error) {
	args := []string{"-brokers", e.brokers, "-topic", topic, "-group", group, "-idemd", e.idemdAddr, "-insecure",
		"-key-header", set.KeyHeader, "-handler-ms", strconv.Itoa(*set.HandlerMS),
		"-ledger", ledger, "-dead-letters", dead}
	if set.Lease != "" { // else the program's default, idemd.DefaultConsumerLease
		args = append(args, "-lease", set.Lease)
	}
	if started != "" {
		args = append(args, "-started", started)
	}
	if c.KillAfterSideEffectOf > 0 {
		args = append(args, "-kill-after", strconv.Itoa(c.KillAfterSideEffectOf))
	}
	if c.KillInHandlerAfterSideEffectOf > 0 {
		args = append(args, "-kill-in-handler-after", strconv.Itoa(c.KillInHandlerAfterSideEffectOf))
	}
	if noHelper {
		args = append(args, "-no-helper")
	}
	if set.Mode != "" {
		args = append(args, "-mode", set.Mode)
	}
	if set.Parallelism > 0 {
		args = append(args, "-parallelism", strconv.Itoa(set.Parallelism))
	}
	p := &consumerProc{cmd: exec.Command(e.exe, args...), exited: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), "IDEMD_TOKEN="+e.token)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.err
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

func (p *consumerProc) stdout() string { return p.out.String() }
func (p *consumerProc) stderr() string { return p.err.String() }

func (p *consumerProc) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

func (p *consumerProc) terminate() {
	if !p.hasExited() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
}

func (p *consumerProc) kill() {
	if !p.hasExited() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// wait returns the exit code, and whether a signal ended the process; it
// kills a process still running after d.
func (p *consumerProc) wait(d time.Duration) (int, bool) {
	select {
	case <-p.exited:
	case <-time.After(d):
		p.kill()
		return -1, false
	}
	state := p.cmd.ProcessState
	if ws, ok := state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return state.ExitCode(), true
	}
	return state.ExitCode(), false
}

func describe(procs []*consumerProc, s scenario) string {
	var b strings.Builder
	for i, p := range procs {
		if p == nil {
			fmt.Fprintf(&b, "\nconsumer %s: not started", s.Consumers[i].Name)
			continue
		}
		fmt.Fprintf(&b, "\nconsumer %s (exited %v): stdout %d bytes, stderr:\n%s", s.Consumers[i].Name, p.hasExited(),
			len(p.stdout()), p.stderr())
	}
	return b.String()
}
