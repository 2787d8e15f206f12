package validate

// Tests of the Helm chart helm/idemd, run by helm/test.sh (which installs
// helm and passes it in IDEMD_HELM). Every rendering goes through Parse
// (strict decoding into the API types) and Check (semantic checks), then
// through the invariants every release must keep, then through the
// assertions of its scenario.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

// kubeVersion is the chart's minimum (Chart.yaml kubeVersion): helm built
// with `go install` defaults to v1.20 for `helm template`.
const kubeVersion = "1.30.0"

var (
	repoRoot string
	chartDir string
	helmBin  string
)

func TestMain(m *testing.M) {
	wd, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	repoRoot = filepath.Clean(filepath.Join(wd, "..", ".."))
	chartDir = filepath.Join(repoRoot, "helm", "idemd")
	helmBin = os.Getenv("IDEMD_HELM")
	if helmBin == "" {
		if helmBin, err = exec.LookPath("helm"); err != nil {
			fmt.Fprintln(os.Stderr, "helm not found: run helm/test.sh (it installs helm) or set IDEMD_HELM")
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}

// runHelm runs helm; stderr lines about followed symlinks are dropped.
func runHelm(args ...string) (string, string, error) {
	cmd := exec.Command(helmBin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+os.TempDir()+"/idemd-helm-cache", "KUBECONFIG=/dev/null")
	err := cmd.Run()
	var kept []string
	for _, line := range strings.Split(stderr.String(), "\n") {
		if line != "" && !strings.Contains(line, "found symbolic link in path") {
			kept = append(kept, line)
		}
	}
	return stdout.String(), strings.Join(kept, "\n"), err
}

// dev prepends the one value the chart has no default for, authentication
// explicitly off, to a test's own values.
func dev(args ...string) []string {
	return append([]string{"--set", "auth.allowUnauthenticated=true"}, args...)
}

func templateArgs(args ...string) []string {
	return append([]string{"template", "idemd", chartDir, "--namespace", "payments", "--kube-version", kubeVersion}, args...)
}

// render templates the chart, strictly decodes and checks every document,
// and checks the invariants of every release.
func render(t *testing.T, args ...string) []Doc {
	t.Helper()
	out, stderr, err := runHelm(templateArgs(args...)...)
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", args, err, stderr)
	}
	return mustValidate(t, out)
}

func mustValidate(t *testing.T, manifest string) []Doc {
	t.Helper()
	docs, err := Parse([]byte(manifest))
	if err != nil {
		t.Fatalf("strict decoding:\n%v", err)
	}
	if len(docs) == 0 {
		t.Fatal("rendered nothing")
	}
	for _, e := range Check(docs) {
		t.Error(e)
	}
	invariants(t, docs)
	return docs
}

func scenarios(t *testing.T) map[string]string {
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil || len(files) < 4 {
		t.Fatalf("scenarios in %s/ci: %v %v", chartDir, files, err)
	}
	out := map[string]string{}
	for _, f := range files {
		out[strings.TrimSuffix(filepath.Base(f), "-values.yaml")] = f
	}
	return out
}

func find[T any](docs []Doc) []T {
	var out []T
	for _, d := range docs {
		if o, ok := d.Obj.(T); ok {
			out = append(out, o)
		}
	}
	return out
}

func one[T any](t *testing.T, docs []Doc) T {
	t.Helper()
	all := find[T](docs)
	if len(all) != 1 {
		var zero T
		t.Fatalf("want exactly one %T, got %d", zero, len(all))
	}
	return all[0]
}

func envOf(c corev1.Container) map[string]corev1.EnvVar {
	out := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		out[e.Name] = e
	}
	return out
}

// serverPod is the pod template of the Deployment or StatefulSet.
func serverPod(t *testing.T, docs []Doc) *corev1.PodTemplateSpec {
	t.Helper()
	var pods []*corev1.PodTemplateSpec
	for _, d := range find[*appsv1.Deployment](docs) {
		pods = append(pods, &d.Spec.Template)
	}
	for _, s := range find[*appsv1.StatefulSet](docs) {
		pods = append(pods, &s.Spec.Template)
	}
	if len(pods) != 1 {
		t.Fatalf("want one server workload, got %d", len(pods))
	}
	return pods[0]
}

// invariants hold for every rendering: scenarios and documented examples.
func invariants(t *testing.T, docs []Doc) {
	t.Helper()
	for _, w := range Workloads(docs) {
		spec := w.Template.Spec
		psc := spec.SecurityContext
		if psc == nil {
			psc = &corev1.PodSecurityContext{}
		}
		for _, c := range spec.Containers {
			where := w.Doc.Name() + " container " + c.Name
			sc := c.SecurityContext
			if sc == nil {
				t.Errorf("%s: no securityContext", where)
				continue
			}
			nonRoot := sc.RunAsNonRoot
			if nonRoot == nil {
				nonRoot = psc.RunAsNonRoot
			}
			user := sc.RunAsUser
			if user == nil {
				user = psc.RunAsUser
			}
			if nonRoot == nil || !*nonRoot {
				t.Errorf("%s: runAsNonRoot is not true: it could run as root", where)
			}
			if user == nil || *user == 0 {
				t.Errorf("%s: runAsUser is unset or 0", where)
			}
			if sc.Privileged != nil && *sc.Privileged {
				t.Errorf("%s: privileged", where)
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("%s: allowPrivilegeEscalation is not false", where)
			}
			if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Errorf("%s: root filesystem is writable", where)
			}
			if sc.Capabilities == nil || !reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
				t.Errorf("%s: capabilities are not drop [ALL]", where)
			}
			seccomp := sc.SeccompProfile
			if seccomp == nil {
				seccomp = psc.SeccompProfile
			}
			if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("%s: seccomp profile is not RuntimeDefault", where)
			}
			if _, ok := c.Resources.Requests[corev1.ResourceMemory]; !ok {
				t.Errorf("%s: no memory request", where)
			}
			if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
				t.Errorf("%s: no memory limit", where)
			}
			if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
				t.Errorf("%s: mounts a service account token it does not need", w.Doc.Name())
			}
		}
		if job, ok := w.Doc.Obj.(*batchv1.Job); ok {
			checkMigrationJob(t, job)
		}
	}
	pod := serverPod(t, docs)
	c := pod.Spec.Containers[0]
	env := envOf(c)
	// `idemd proxy` (proxy.enabled) serves gRPC on IDEMD_GRPC_LISTEN; it must
	// serve it, since the probes are gRPC.
	grpcListen := "IDEMD_LISTEN"
	if len(c.Args) > 0 && c.Args[0] == "proxy" {
		grpcListen = "IDEMD_GRPC_LISTEN"
		if _, ok := env["IDEMD_LISTEN"]; ok {
			t.Errorf("idemd proxy is given IDEMD_LISTEN, which it does not read")
		}
	}
	for name, probe := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if _, tls := env["IDEMD_TLS_CERT"]; tls {
			// The kubelet's gRPC probes cannot speak TLS: with TLS the
			// chart probes the port with tcpSocket.
			if probe == nil || probe.TCPSocket == nil || probe.GRPC != nil {
				t.Errorf("%s probe with TLS on is not tcpSocket", name)
				continue
			}
			if !strings.HasSuffix(env[grpcListen].Value, ":"+probe.TCPSocket.Port.String()) {
				t.Errorf("%s probe port %s is not the listen address %s", name, probe.TCPSocket.Port.String(), env[grpcListen].Value)
			}
			continue
		}
		if probe == nil || probe.GRPC == nil {
			t.Errorf("%s probe is not a native gRPC probe", name)
			continue
		}
		want := ""
		if name == "readiness" {
			want = "idemd.v1.Idempotency"
		}
		if probe.GRPC.Service == nil || *probe.GRPC.Service != want {
			t.Errorf("%s probe asks grpc.health.v1 for %v, want %q", name, probe.GRPC.Service, want)
		}
		if !strings.HasSuffix(env[grpcListen].Value, ":"+strconv.Itoa(int(probe.GRPC.Port))) {
			t.Errorf("%s probe port %d is not the listen address %s", name, probe.GRPC.Port, env[grpcListen].Value)
		}
	}
	drain, err := strconv.Atoi(strings.TrimSuffix(env["IDEMD_DRAIN_TIMEOUT"].Value, "s"))
	if err != nil {
		t.Errorf("IDEMD_DRAIN_TIMEOUT %q is not whole seconds", env["IDEMD_DRAIN_TIMEOUT"].Value)
	}
	preStop := 0
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		preStop = int(c.Lifecycle.PreStop.Sleep.Seconds)
	}
	if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || int(*g) < preStop+drain {
		t.Errorf("terminationGracePeriodSeconds %v < preStop %d + drain %d", g, preStop, drain)
	}
	// The policies file is mounted, parses, and the checksum tracks it.
	var cm *corev1.ConfigMap
	for _, m := range find[*corev1.ConfigMap](docs) {
		if _, ok := m.Data["policies.toml"]; ok {
			cm = m
		}
	}
	if cm == nil {
		t.Fatal("no policies ConfigMap")
	}
	checkPoliciesToml(t, cm.Data["policies.toml"])
	mounted := false
	for _, v := range pod.Spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
			for _, m := range c.VolumeMounts {
				if m.Name == v.Name && filepath.Join(m.MountPath, "policies.toml") == env["IDEMD_CONFIG"].Value {
					mounted = true
				}
			}
		}
	}
	if !mounted {
		t.Errorf("IDEMD_CONFIG %q is not the mounted ConfigMap %s", env["IDEMD_CONFIG"].Value, cm.Name)
	}
	if pod.Annotations["checksum/config"] == "" {
		t.Error("no checksum/config annotation: pods would not restart on a policy change")
	}
	// Services: gRPC with appProtocol, metrics port.
	for _, s := range find[*corev1.Service](docs) {
		names := map[string]corev1.ServicePort{}
		for _, p := range s.Spec.Ports {
			names[p.Name] = p
		}
		if p := names["grpc"]; p.AppProtocol == nil || *p.AppProtocol != "grpc" {
			t.Errorf("Service %s: grpc port without appProtocol grpc", s.Name)
		}
		if _, ok := names["metrics"]; !ok {
			t.Errorf("Service %s: no metrics port", s.Name)
		}
	}
	if env["IDEMD_METRICS_LISTEN"].Value == "" {
		t.Error("IDEMD_METRICS_LISTEN not set")
	}
	// Every TLS file the server is pointed at lies in a volume mounted
	// read-only from the Secret or ConfigMap holding it, under its key.
	for _, name := range []string{"IDEMD_TLS_CERT", "IDEMD_TLS_KEY", "IDEMD_TLS_CLIENT_CA", "IDEMD_TLS_CLIENT_TENANTS"} {
		if e, ok := env[name]; ok {
			if _, _, ok := mountedFile(pod, c, e.Value); !ok {
				t.Errorf("%s=%s is not a file of a mounted Secret or ConfigMap", name, e.Value)
			}
		}
	}
	// Every secret reference is to an existing Secret that holds the key
	// the env or the file path uses.
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef == nil {
			t.Errorf("env %s: only secretKeyRef is expected", e.Name)
		}
	}
}

// mountedFile finds the Secret or ConfigMap volume that provides path in
// container c: its source name ("secret/NAME" or "configmap/NAME"), the key,
// and whether it was found (read-only mount, key projected to the file).
func mountedFile(pod *corev1.PodTemplateSpec, c corev1.Container, path string) (string, string, bool) {
	for _, m := range c.VolumeMounts {
		if !m.ReadOnly || filepath.Dir(path) != filepath.Clean(m.MountPath) {
			continue
		}
		file := filepath.Base(path)
		for _, v := range pod.Spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			var source string
			var items []corev1.KeyToPath
			switch {
			case v.Secret != nil:
				source, items = "secret/"+v.Secret.SecretName, v.Secret.Items
			case v.ConfigMap != nil:
				source, items = "configmap/"+v.ConfigMap.Name, v.ConfigMap.Items
			default:
				continue
			}
			for _, item := range items {
				if item.Path == file {
					return source, item.Key, true
				}
			}
		}
	}
	return "", "", false
}

func checkMigrationJob(t *testing.T, job *batchv1.Job) {
	t.Helper()
	hooks := strings.Split(job.Annotations["helm.sh/hook"], ",")
	sort.Strings(hooks)
	if !reflect.DeepEqual(hooks, []string{"pre-install", "pre-upgrade"}) {
		t.Errorf("Job %s: helm.sh/hook = %q, want pre-install,pre-upgrade", job.Name, job.Annotations["helm.sh/hook"])
	}
	if !strings.Contains(job.Annotations["helm.sh/hook-delete-policy"], "before-hook-creation") {
		t.Errorf("Job %s: a failed hook Job would block the next upgrade (hook-delete-policy %q)", job.Name, job.Annotations["helm.sh/hook-delete-policy"])
	}
	if job.Spec.BackoffLimit == nil || *job.Spec.BackoffLimit < 1 {
		t.Errorf("Job %s: no backoffLimit", job.Name)
	}
	if job.Spec.ActiveDeadlineSeconds == nil || *job.Spec.ActiveDeadlineSeconds <= 0 || *job.Spec.ActiveDeadlineSeconds >= 300 {
		t.Errorf("Job %s: activeDeadlineSeconds %v must be set and below helm's default --timeout 5m", job.Name, job.Spec.ActiveDeadlineSeconds)
	}
	c := job.Spec.Template.Spec.Containers[0]
	if !reflect.DeepEqual(c.Args, []string{"migrate"}) {
		t.Errorf("Job %s: args %v, want [migrate]", job.Name, c.Args)
	}
	if job.Spec.Template.Spec.ServiceAccountName != "" && strings.HasSuffix(job.Spec.Template.Spec.ServiceAccountName, "-idemd") {
		t.Errorf("Job %s: uses the chart's ServiceAccount, which does not exist yet at pre-install", job.Name)
	}
	env := envOf(c)
	for _, name := range []string{"IDEMD_CQL_NODES", "IDEMD_KEYSPACE", "IDEMD_REPLICATION"} {
		if env[name].Value == "" {
			t.Errorf("Job %s: %s not set", job.Name, name)
		}
	}
}

// policyFile mirrors the server's policy table (src/config.rs PolicyFile)
// plus `audit`; decoding rejects unknown keys and wrong types.
type policyFile struct {
	TTL              *string  `toml:"ttl"`
	MaxTTL           *string  `toml:"max_ttl"`
	Lease            *string  `toml:"lease"`
	MaxWait          *string  `toml:"max_wait"`
	MaxResponseBytes *int64   `toml:"max_response_bytes"`
	IgnoreFields     []string `toml:"ignore_fields"`
	OnExpiredLease   *string  `toml:"on_expired_lease"`
	Audit            *bool    `toml:"audit"`
}

type configFile struct {
	Defaults  policyFile            `toml:"defaults"`
	Endpoints map[string]policyFile `toml:"endpoints"`
}

var humantime = regexp.MustCompile(`^\s*([0-9]+\s*[a-zµ]+\s*)+$`)

func checkPoliciesToml(t *testing.T, text string) configFile {
	t.Helper()
	var cf configFile
	md, err := toml.Decode(text, &cf)
	if err != nil {
		t.Fatalf("policies.toml does not parse: %v\n%s", err, text)
	}
	if un := md.Undecoded(); len(un) > 0 {
		t.Errorf("policies.toml has keys the server rejects: %v", un)
	}
	all := map[string]policyFile{"defaults": cf.Defaults}
	for k, v := range cf.Endpoints {
		all[k] = v
	}
	for name, p := range all {
		for _, d := range []*string{p.TTL, p.MaxTTL, p.Lease, p.MaxWait} {
			if d != nil && !humantime.MatchString(*d) {
				t.Errorf("policies.toml %s: %q is not a duration", name, *d)
			}
		}
		if p.OnExpiredLease != nil && *p.OnExpiredLease != "reconcile" && *p.OnExpiredLease != "takeover" {
			t.Errorf("policies.toml %s: on_expired_lease %q", name, *p.OnExpiredLease)
		}
	}
	return cf
}

// ---------------------------------------------------------------- scenarios

func TestLint(t *testing.T) {
	cases := map[string][]string{"no values but auth.allowUnauthenticated": dev()}
	for name, file := range scenarios(t) {
		cases[name] = []string{"-f", file}
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			out, stderr, err := runHelm(append([]string{"lint", "--strict", "--kube-version", kubeVersion, chartDir}, args...)...)
			if err != nil || !strings.Contains(out, "0 chart(s) failed") {
				t.Fatalf("helm lint --strict: %v\n%s\n%s", err, out, stderr)
			}
		})
	}
}

func TestScenarios(t *testing.T) {
	for name, file := range scenarios(t) {
		t.Run(name, func(t *testing.T) { render(t, "-f", file) })
	}
}

// TestDefaultRenderRefusesAuthOff: a plain install would give every pod
// that reaches the port every tenant's keys; the chart refuses, naming the
// values that fix it, and marks the explicit opt-out for the server.
func TestDefaultRenderRefusesAuthOff(t *testing.T) {
	_, stderr, err := runHelm(templateArgs()...)
	if err == nil {
		t.Fatal("the default values rendered with authentication off")
	}
	for _, want := range []string{"authentication is off", "auth.existingSecret", "tls.clientTenants", "auth.allowUnauthenticated=true"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the refusal does not name %q:\n%s", want, stderr)
		}
	}
	env := envOf(serverPod(t, render(t, dev()...)).Spec.Containers[0])
	if env["IDEMD_ALLOW_UNAUTHENTICATED_REMOTE"].Value != "true" {
		t.Errorf("auth.allowUnauthenticated=true does not reach the server: %v", env["IDEMD_ALLOW_UNAUTHENTICATED_REMOTE"])
	}
	for name, args := range map[string][]string{
		"tokens": {"--set", "auth.existingSecret=tok"},
		"mtls":   {"--set", "tls.existingSecret=t", "--set", "tls.clientCA.existingSecret=ca", "--set", "tls.clientTenants.existingConfigMap=m"},
	} {
		env := envOf(serverPod(t, render(t, args...)).Spec.Containers[0])
		if _, ok := env["IDEMD_ALLOW_UNAUTHENTICATED_REMOTE"]; ok {
			t.Errorf("%s: the opt-out is set with authentication on", name)
		}
	}
}

func TestDefaultsAreCQLWithThreeReplicas(t *testing.T) {
	docs := render(t, dev()...)
	dep := one[*appsv1.Deployment](t, docs)
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 3 {
		t.Errorf("replicas %v, want 3", dep.Spec.Replicas)
	}
	if len(find[*appsv1.StatefulSet](docs)) != 0 {
		t.Error("a StatefulSet with store=cql")
	}
	pdb := one[*policyv1.PodDisruptionBudget](t, docs)
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PDB maxUnavailable %v", pdb.Spec.MaxUnavailable)
	}
	if s := dep.Spec.Strategy.RollingUpdate; s == nil || s.MaxUnavailable == nil || s.MaxUnavailable.IntValue() != 0 {
		t.Error("rolling update may drop below the current capacity")
	}
	tsc := dep.Spec.Template.Spec.TopologySpreadConstraints
	keys := []string{}
	for _, c := range tsc {
		keys = append(keys, c.TopologyKey)
		if c.LabelSelector == nil || c.LabelSelector.MatchLabels["app.kubernetes.io/component"] != "server" {
			t.Errorf("spread constraint %s does not select the server pods", c.TopologyKey)
		}
	}
	if !reflect.DeepEqual(keys, []string{"topology.kubernetes.io/zone", "kubernetes.io/hostname"}) {
		t.Errorf("spread over %v", keys)
	}
	job := one[*batchv1.Job](t, docs)
	if job.Spec.PodFailurePolicy == nil {
		t.Error("migration Job without podFailurePolicy (a config error would be retried)")
	}
	env := envOf(dep.Spec.Template.Spec.Containers[0])
	if env["IDEMD_STORE"].Value != "cql" || env["IDEMD_CQL_NODES"].Value == "" {
		t.Errorf("store env: %v %v", env["IDEMD_STORE"], env["IDEMD_CQL_NODES"])
	}
	if _, ok := env["IDEMD_AUTH_TOKENS"]; ok {
		t.Error("auth tokens without auth.existingSecret")
	}
	for _, kind := range []string{"HorizontalPodAutoscaler", "NetworkPolicy", "ServiceMonitor", "PrometheusRule"} {
		for _, d := range docs {
			if d.GVK.Kind == kind {
				t.Errorf("%s rendered by default", kind)
			}
		}
	}
	if n := len(find[*corev1.Service](docs)); n != 1 {
		t.Errorf("%d Services by default, want 1 (headless is opt-in)", n)
	}
}

func TestEmbeddedIsOneReplicaWithAPersistentVolume(t *testing.T) {
	for _, args := range [][]string{
		dev("--set", "store=embedded"),
		dev("--set", "store=embedded", "--set", "replicaCount=1"),
		{"-f", filepath.Join(chartDir, "ci", "embedded-values.yaml")},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			docs := render(t, args...)
			sts := one[*appsv1.StatefulSet](t, docs)
			if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 1 {
				t.Errorf("replicas %v, want 1", sts.Spec.Replicas)
			}
			if len(sts.Spec.VolumeClaimTemplates) != 1 {
				t.Fatalf("volumeClaimTemplates: %d", len(sts.Spec.VolumeClaimTemplates))
			}
			claim := sts.Spec.VolumeClaimTemplates[0]
			c := sts.Spec.Template.Spec.Containers[0]
			dataDir := envOf(c)["IDEMD_DATA_DIR"].Value
			mounted := false
			for _, m := range c.VolumeMounts {
				if m.Name == claim.Name && m.MountPath == dataDir && !m.ReadOnly {
					mounted = true
				}
			}
			if !mounted {
				t.Errorf("IDEMD_DATA_DIR %q is not the PVC %s", dataDir, claim.Name)
			}
			if envOf(c)["IDEMD_STORE"].Value != "embedded" {
				t.Error("IDEMD_STORE is not embedded")
			}
			if sts.Spec.Template.Spec.SecurityContext.FSGroup == nil {
				t.Error("no fsGroup: the non-root user could not write the volume")
			}
			for _, kind := range []string{"Deployment", "Job", "PodDisruptionBudget", "HorizontalPodAutoscaler"} {
				for _, d := range docs {
					if d.GVK.Kind == kind {
						t.Errorf("%s rendered with store=embedded", kind)
					}
				}
			}
			headless := false
			for _, s := range find[*corev1.Service](docs) {
				if s.Name == sts.Spec.ServiceName && s.Spec.ClusterIP == corev1.ClusterIPNone {
					headless = true
				}
			}
			if !headless {
				t.Errorf("serviceName %s is not a rendered headless Service", sts.Spec.ServiceName)
			}
		})
	}
	ss := render(t, "-f", filepath.Join(chartDir, "ci", "embedded-values.yaml"))
	claim := one[*appsv1.StatefulSet](t, ss).Spec.VolumeClaimTemplates[0]
	if claim.Spec.StorageClassName == nil || *claim.Spec.StorageClassName != "fast-ssd" || claim.Spec.Resources.Requests.Storage().String() != "20Gi" {
		t.Errorf("persistence values not applied: %v %v", claim.Spec.StorageClassName, claim.Spec.Resources.Requests)
	}
}

func TestCQLWithEverythingOn(t *testing.T) {
	docs := render(t, "-f", filepath.Join(chartDir, "ci", "cql-full-values.yaml"))
	dep := one[*appsv1.Deployment](t, docs)
	if dep.Spec.Replicas != nil {
		t.Error("replicas set although the HPA owns them")
	}
	hpa := one[*autoscalingv2.HorizontalPodAutoscaler](t, docs)
	if *hpa.Spec.MinReplicas != 3 || hpa.Spec.MaxReplicas != 12 {
		t.Errorf("HPA %d-%d", *hpa.Spec.MinReplicas, hpa.Spec.MaxReplicas)
	}
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]
	env := envOf(c)
	if c.Image != "registry.example.com/platform/idemd@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" {
		t.Errorf("image %s", c.Image)
	}
	want := map[string]string{
		"IDEMD_CQL_NODES":             "scylla-0.scylla.db.svc:9142,scylla-1.scylla.db.svc:9142,scylla-2.scylla.db.svc:9142",
		"IDEMD_KEYSPACE":              "idemd_prod",
		"IDEMD_CQL_CONSISTENCY":       "local-quorum",
		"IDEMD_CQL_LOCAL_DC":          "eu-west-1",
		"IDEMD_CQL_REQUEST_TIMEOUT":   "3s",
		"IDEMD_CQL_LWT_TIMEOUT":       "8s",
		"IDEMD_DRAIN_TIMEOUT":         "30s",
		"IDEMD_AUTH_TOKENS":           "/etc/idemd/auth/tokens",
		"IDEMD_AUDIT_RETENTION":       "90d",
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.observability.svc:4317",
	}
	for k, v := range want {
		if env[k].Value != v {
			t.Errorf("%s = %q, want %q", k, env[k].Value, v)
		}
	}
	for _, k := range []string{"IDEMD_CQL_USERNAME", "IDEMD_CQL_PASSWORD"} {
		ref := env[k].ValueFrom
		if ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != "idemd-cql-credentials" {
			t.Errorf("%s is not from the Secret idemd-cql-credentials", k)
		}
	}
	// The CA path and the tokens path are files of mounted Secrets.
	mountedFile := func(path, secret string) bool {
		for _, m := range c.VolumeMounts {
			for _, v := range pod.Volumes {
				if v.Name == m.Name && v.Secret != nil && v.Secret.SecretName == secret {
					for _, item := range v.Secret.Items {
						if filepath.Join(m.MountPath, item.Path) == path && m.SubPath == "" {
							return true
						}
					}
				}
			}
		}
		return false
	}
	if !mountedFile(env["IDEMD_CQL_TLS_CA"].Value, "scylla-ca") {
		t.Errorf("IDEMD_CQL_TLS_CA %q is not a file of the Secret scylla-ca", env["IDEMD_CQL_TLS_CA"].Value)
	}
	// Mounted as a directory (no subPath) so that Secret updates reach the
	// pod and the server's reload picks them up.
	if !mountedFile(env["IDEMD_AUTH_TOKENS"].Value, "idemd-tokens") {
		t.Errorf("IDEMD_AUTH_TOKENS %q is not a file of the Secret idemd-tokens", env["IDEMD_AUTH_TOKENS"].Value)
	}
	job := one[*batchv1.Job](t, docs)
	jenv := envOf(job.Spec.Template.Spec.Containers[0])
	for _, k := range []string{"IDEMD_CQL_NODES", "IDEMD_KEYSPACE", "IDEMD_CQL_CONSISTENCY", "IDEMD_CQL_LOCAL_DC", "IDEMD_CQL_TLS_CA"} {
		if jenv[k].Value != env[k].Value {
			t.Errorf("migration Job %s = %q, server %q", k, jenv[k].Value, env[k].Value)
		}
	}
	if jenv["IDEMD_REPLICATION"].Value != "{'class': 'NetworkTopologyStrategy', 'eu-west-1': 3}" {
		t.Errorf("IDEMD_REPLICATION %q", jenv["IDEMD_REPLICATION"].Value)
	}
	if *pod.TerminationGracePeriodSeconds != 60 || c.Lifecycle.PreStop.Sleep.Seconds != 10 {
		t.Error("termination values not applied")
	}
	sm := one[*monitoringv1.ServiceMonitor](t, docs)
	if sm.Labels["release"] != "kube-prometheus-stack" || sm.Spec.Endpoints[0].Port != "metrics" {
		t.Errorf("ServiceMonitor %v %v", sm.Labels, sm.Spec.Endpoints)
	}
	np := one[*networkingv1.NetworkPolicy](t, docs)
	if len(np.Spec.PolicyTypes) != 2 || len(np.Spec.Egress) != 2 || len(np.Spec.Ingress) != 2 {
		t.Errorf("NetworkPolicy %v ingress %d egress %d", np.Spec.PolicyTypes, len(np.Spec.Ingress), len(np.Spec.Egress))
	}
	if len(find[*corev1.Service](docs)) != 2 {
		t.Error("headless Service missing")
	}
	one[*monitoringv1.PrometheusRule](t, docs)
	cf := checkPoliciesToml(t, one[*corev1.ConfigMap](t, onlyPolicies(docs)).Data["policies.toml"])
	pay := cf.Endpoints["POST /v1/payments"]
	if pay.Audit == nil || !*pay.Audit || *pay.TTL != "72h" || len(pay.IgnoreFields) != 2 {
		t.Errorf("payments policy %+v", pay)
	}
	if *cf.Defaults.MaxResponseBytes != 262144 {
		t.Errorf("max_response_bytes %v", *cf.Defaults.MaxResponseBytes)
	}
}

func onlyPolicies(docs []Doc) []Doc {
	var out []Doc
	for _, d := range docs {
		if cm, ok := d.Obj.(*corev1.ConfigMap); ok {
			if _, ok := cm.Data["policies.toml"]; ok {
				out = append(out, d)
			}
		}
	}
	return out
}

func TestOperatorScenario(t *testing.T) {
	docs := render(t, "-f", filepath.Join(chartDir, "ci", "cql-operator-values.yaml"))
	dep := one[*appsv1.Deployment](t, docs)
	if *dep.Spec.Replicas != 5 {
		t.Errorf("replicas %d", *dep.Spec.Replicas)
	}
	if len(find[*batchv1.Job](docs))+len(find[*policyv1.PodDisruptionBudget](docs)) != 0 {
		t.Error("Job or PDB rendered although disabled")
	}
	pod := dep.Spec.Template.Spec
	found := false
	for _, v := range pod.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == "scylla-local-serving-ca" {
			found = true
		}
	}
	if !found || envOf(pod.Containers[0])["IDEMD_CQL_TLS_CA"].Value != "/etc/idemd/cql-tls/ca-bundle.crt" {
		t.Error("CA from the operator's ConfigMap not mounted")
	}
	if pod.TopologySpreadConstraints[0].WhenUnsatisfiable != corev1.DoNotSchedule || pod.TopologySpreadConstraints[0].LabelSelector == nil {
		t.Error("custom spread constraint not applied with the pods' selector")
	}
}

func TestTLSAndMTLS(t *testing.T) {
	type file struct{ source, key string }
	files := func(t *testing.T, docs []Doc) (map[string]file, *corev1.Container) {
		pod := serverPod(t, docs)
		c := pod.Spec.Containers[0]
		out := map[string]file{}
		for name, e := range envOf(c) {
			if strings.HasPrefix(name, "IDEMD_TLS_") {
				source, key, ok := mountedFile(pod, c, e.Value)
				if !ok {
					t.Fatalf("%s=%s is not mounted", name, e.Value)
				}
				out[name] = file{source, key}
			}
		}
		return out, &c
	}

	// The scenario: TLS, mTLS with a tenants ConfigMap, and tokens.
	docs := render(t, "-f", filepath.Join(chartDir, "ci", "mtls-values.yaml"))
	got, c := files(t, docs)
	want := map[string]file{
		"IDEMD_TLS_CERT":           {"secret/idemd-tls", "tls.crt"},
		"IDEMD_TLS_KEY":            {"secret/idemd-tls", "tls.key"},
		"IDEMD_TLS_CLIENT_CA":      {"secret/idemd-client-ca", "ca.crt"},
		"IDEMD_TLS_CLIENT_TENANTS": {"configmap/idemd-client-tenants", "client-tenants"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("TLS files:\n got %v\nwant %v", got, want)
	}
	if envOf(*c)["IDEMD_AUTH_TOKENS"].Value == "" {
		t.Error("tokens not configured beside mTLS")
	}
	if c.ReadinessProbe.TCPSocket == nil {
		t.Error("readiness is not tcpSocket with TLS on")
	}

	// Server TLS only: no client CA, no mapping; probes tcpSocket.
	got, c = files(t, render(t, dev("--set", "tls.existingSecret=web-tls")...))
	if len(got) != 2 || got["IDEMD_TLS_CERT"] != (file{"secret/web-tls", "tls.crt"}) {
		t.Errorf("server TLS only: %v", got)
	}
	if c.StartupProbe.TCPSocket == nil || c.LivenessProbe.TCPSocket == nil {
		t.Error("probes are not tcpSocket with TLS on")
	}

	// The mapping from a Secret, with a custom key; no tokens.
	got, _ = files(t, render(t, "--set", "tls.existingSecret=t", "--set", "tls.clientCA.existingSecret=ca", "--set", "tls.clientCA.key=bundle.pem",
		"--set", "tls.clientTenants.existingSecret=map", "--set", "tls.clientTenants.key=tenants.txt"))
	if got["IDEMD_TLS_CLIENT_TENANTS"] != (file{"secret/map", "tenants.txt"}) || got["IDEMD_TLS_CLIENT_CA"] != (file{"secret/ca", "bundle.pem"}) {
		t.Errorf("mapping from a Secret: %v", got)
	}

	// Without TLS the probes stay native gRPC and no TLS variable is set.
	got, c = files(t, render(t, dev()...))
	if len(got) != 0 || c.ReadinessProbe.GRPC == nil {
		t.Errorf("TLS off: files %v, readiness %v", got, c.ReadinessProbe)
	}
}

func TestEncryptionKeyring(t *testing.T) {
	// keyring returns the IDEMD_ENCRYPTION_KEYS file's Secret and key, and
	// the mode of its volume; "" when encryption is off.
	keyring := func(t *testing.T, docs []Doc) (source, key string, mode int32) {
		t.Helper()
		pod := serverPod(t, docs)
		c := pod.Spec.Containers[0]
		e, ok := envOf(c)["IDEMD_ENCRYPTION_KEYS"]
		if !ok {
			for _, v := range pod.Spec.Volumes {
				if v.Name == "encryption-keys" {
					t.Error("encryption-keys volume without IDEMD_ENCRYPTION_KEYS")
				}
			}
			return "", "", 0
		}
		// The file must lie in a read-only mount of a Secret volume that
		// projects one of its keys to that file name.
		for _, m := range c.VolumeMounts {
			if !m.ReadOnly || filepath.Dir(e.Value) != filepath.Clean(m.MountPath) {
				continue
			}
			for _, v := range pod.Spec.Volumes {
				if v.Name != m.Name || v.Secret == nil {
					continue
				}
				for _, item := range v.Secret.Items {
					if item.Path == filepath.Base(e.Value) {
						source, key = "secret/"+v.Secret.SecretName, item.Key
						if v.Secret.DefaultMode != nil {
							mode = *v.Secret.DefaultMode
						}
					}
				}
			}
		}
		if source == "" {
			t.Fatalf("IDEMD_ENCRYPTION_KEYS=%s is not a file of a mounted Secret", e.Value)
		}
		return source, key, mode
	}

	// The scenario: embedded store, keyring under a custom key.
	source, key, mode := keyring(t, render(t, "-f", filepath.Join(chartDir, "ci", "encryption-values.yaml")))
	if source != "secret/idemd-encryption-keys" || key != "keyring" {
		t.Errorf("scenario keyring: %s key %s", source, key)
	}
	// Readable by the pod's fsGroup, never by others.
	if mode == 0 || mode&0o007 != 0 {
		t.Errorf("keyring volume mode %o is world-accessible or unset", mode)
	}

	// CQL (the default store), default key.
	source, key, _ = keyring(t, render(t, dev("--set", "encryption.existingSecret=keys")...))
	if source != "secret/keys" || key != "keys" {
		t.Errorf("cql keyring: %s key %s", source, key)
	}

	// Off by default: no variable, no volume.
	if source, _, _ := keyring(t, render(t, dev()...)); source != "" {
		t.Errorf("encryption on by default: %s", source)
	}

	// The migration job never needs the keyring.
	for _, job := range find[*batchv1.Job](render(t, dev("--set", "encryption.existingSecret=keys")...)) {
		for _, c := range job.Spec.Template.Spec.Containers {
			if _, ok := envOf(c)["IDEMD_ENCRYPTION_KEYS"]; ok {
				t.Errorf("job %s gets the keyring", job.Name)
			}
		}
	}
}

func TestPoliciesChangeRestartsPods(t *testing.T) {
	checksum := func(args ...string) string {
		return serverPod(t, render(t, dev(args...)...)).Annotations["checksum/config"]
	}
	base := checksum()
	if base != checksum() {
		t.Error("checksum not deterministic")
	}
	if base == checksum("--set", "policies.defaults.ttl=48h") {
		t.Error("checksum unchanged by a policy change")
	}
	if base != checksum("--set", "replicaCount=4") {
		t.Error("checksum changed without a policy change")
	}
}

// --------------------------------------------------------------- monitoring

type ruleFile struct {
	Groups []monitoringv1.RuleGroup `json:"groups"`
}

func readRuleFile(t *testing.T, name string) ruleFile {
	t.Helper()
	path := filepath.Join(repoRoot, "deploy", "prometheus", name)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%s: %v (the PrometheusRule embeds it)", path, err)
	}
	var f ruleFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(f.Groups) == 0 {
		t.Fatalf("%s has no groups", path)
	}
	return f
}

func TestPrometheusRuleIsDeployPrometheus(t *testing.T) {
	// The chart reads the files through symlinks, not copies.
	for _, name := range []string{"idemd.rules.yml", "idemd.alerts.yml"} {
		link := filepath.Join(chartDir, "files", name)
		target, err := os.Readlink(link)
		if err != nil {
			t.Errorf("%s is not a symlink: %v", link, err)
		} else if filepath.Clean(filepath.Join(filepath.Dir(link), target)) != filepath.Join(repoRoot, "deploy", "prometheus", name) {
			t.Errorf("%s -> %s, not deploy/prometheus/%s", link, target, name)
		}
	}
	rules, alerts := readRuleFile(t, "idemd.rules.yml"), readRuleFile(t, "idemd.alerts.yml")
	docs := render(t, dev("--set", "metrics.prometheusRule.enabled=true")...)
	pr := one[*monitoringv1.PrometheusRule](t, docs)
	rendered := map[string]int{}
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			rendered[r.Alert+r.Record]++
		}
	}
	count := 0
	for _, g := range alerts.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			count++
			if rendered[r.Alert] == 0 {
				t.Errorf("alert %s of deploy/prometheus/idemd.alerts.yml is not in the PrometheusRule", r.Alert)
			}
		}
	}
	if count == 0 {
		t.Error("deploy/prometheus/idemd.alerts.yml has no alerts")
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if rendered[r.Record+r.Alert] == 0 {
				t.Errorf("rule %s of deploy/prometheus/idemd.rules.yml is not in the PrometheusRule", r.Record+r.Alert)
			}
		}
	}
	// Not just the names: the groups are the files' groups, unchanged.
	want := append(append([]monitoringv1.RuleGroup{}, rules.Groups...), alerts.Groups...)
	if !reflect.DeepEqual(pr.Spec.Groups, want) {
		got, _ := json.MarshalIndent(pr.Spec.Groups, "", " ")
		exp, _ := json.MarshalIndent(want, "", " ")
		t.Errorf("PrometheusRule groups differ from deploy/prometheus:\n got %d bytes\nwant %d bytes", len(got), len(exp))
	}
	t.Logf("%d alerts, %d rule groups", count, len(want))
}

func TestPackagedChartFollowsSymlinks(t *testing.T) {
	dir := t.TempDir()
	if out, stderr, err := runHelm("package", chartDir, "-d", dir); err != nil {
		t.Fatalf("helm package: %v\n%s%s", err, out, stderr)
	}
	files := untar(t, filepath.Join(dir, "idemd-0.1.0.tgz"))
	for _, name := range []string{"idemd.rules.yml", "idemd.alerts.yml"} {
		want, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "prometheus", name))
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := files["idemd/files/"+name]; !ok || !bytes.Equal(got, want) {
			t.Errorf("packaged files/%s is not deploy/prometheus/%s", name, name)
		}
	}
	for name := range files {
		if strings.HasPrefix(name, "idemd/ci/") {
			t.Errorf("test scenario %s is packaged", name)
		}
	}
	if _, ok := files["idemd/values.schema.json"]; !ok {
		t.Error("values.schema.json not packaged")
	}
}

func untar(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	out := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = data
	}
	return out
}

var metricConst = regexp.MustCompile(`"(idemd_[a-z0-9_]+)"`)
var metricUse = regexp.MustCompile(`\bidemd_[a-z0-9_]+\b`)

func TestGrafanaDashboard(t *testing.T) {
	docs := render(t, dev("--set", "grafana.dashboard.enabled=true")...)
	var text string
	for _, cm := range find[*corev1.ConfigMap](docs) {
		if v, ok := cm.Data["idemd.json"]; ok {
			text = v
			if cm.Labels["grafana_dashboard"] != "1" {
				t.Error("dashboard ConfigMap without the sidecar label")
			}
		}
	}
	var dash struct {
		UID        string `json:"uid"`
		Title      string `json:"title"`
		Templating struct {
			List []struct {
				Name string `json:"name"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(text), &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Error("dashboard without uid/title")
	}
	vars := map[string]bool{"__rate_interval": true}
	for _, v := range dash.Templating.List {
		vars[v.Name] = true
	}
	// Metric names must be the server's (src/metrics.rs), or the panels stay empty.
	src, err := os.ReadFile(filepath.Join(repoRoot, "src", "metrics.rs"))
	if err != nil {
		t.Fatalf("src/metrics.rs (the metric names the dashboard must use): %v", err)
	}
	known := map[string]bool{}
	for _, m := range metricConst.FindAllStringSubmatch(string(src), -1) {
		known[m[1]] = true
	}
	var titles []string
	varUse := regexp.MustCompile(`\$\{?([A-Za-z_]+)`)
	for _, p := range dash.Panels {
		titles = append(titles, strings.ToLower(p.Title))
		for _, target := range p.Targets {
			for _, name := range metricUse.FindAllString(target.Expr, -1) {
				base := name
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					if known[strings.TrimSuffix(name, suffix)] {
						base = strings.TrimSuffix(name, suffix)
					}
				}
				if !known[base] {
					t.Errorf("panel %q uses %s, which src/metrics.rs does not define", p.Title, name)
				}
			}
			for _, v := range varUse.FindAllStringSubmatch(target.Expr, -1) {
				if !vars[v[1]] {
					t.Errorf("panel %q uses undefined variable $%s", p.Title, v[1])
				}
			}
		}
	}
	all := strings.Join(titles, "\n")
	for _, want := range []string{"replay ratio", "409", "422", "rpc latency", "pending records", "store latency"} {
		if !strings.Contains(all, want) {
			t.Errorf("no panel about %q", want)
		}
	}
}

// ------------------------------------------------------- refused values

func TestSchemaRejectsBadValues(t *testing.T) {
	for name, args := range map[string][]string{
		"replicaCount string":     {"--set", "replicaCount=three"},
		"store unknown":           {"--set", "store=redis"},
		"unknown top-level key":   {"--set", "replicas=3"},
		"consistency unknown":     {"--set", "cql.consistency=all"},
		"ttl not a duration":      {"--set", "policies.defaults.ttl=forever"},
		"ttl a number":            {"--set-json", `policies.defaults.ttl=5`},
		"unknown policy key":      {"--set", "policies.defaults.leese=1s"},
		"max_response_bytes big":  {"--set", "policies.defaults.max_response_bytes=99999999"},
		"nodes without port":      {"--set", "cql.nodes={scylla}"},
		"on_expired_lease":        {"--set", "policies.defaults.on_expired_lease=retry"},
		"drain negative":          {"--set", "server.drainTimeoutSeconds=-1"},
		"probe type switched":     {"--set", "probes.liveness.httpGet.port=80"},
		"tls.enabled not boolean": {"--set-string", "cql.tls.enabled=yes"},
		"audit retention":         {"--set", "server.auditRetention=forever"},
		"otlp endpoint no scheme": {"--set", "server.otlpEndpoint=collector:4317"},
		"tls unknown key":         {"--set", "tls.cert=/tls.crt"},
		"tls secret not a name":   {"--set", "tls.existingSecret=Not_A_Name"},
		"encryption unknown key":  {"--set", "encryption.file=/keys"},
		"encryption secret name":  {"--set", "encryption.existingSecret=Not_A_Name"},
		"encryption key path":     {"--set", "encryption.key=../keys"},
	} {
		t.Run(name, func(t *testing.T) {
			_, stderr, err := runHelm(templateArgs(args...)...)
			if err == nil {
				t.Fatal("rendered; the schema should refuse it")
			}
			if !strings.Contains(stderr, "values don't meet the specifications of the schema") {
				t.Fatalf("refused, but not by values.schema.json:\n%s", stderr)
			}
		})
	}
}

func TestRefusedCombinations(t *testing.T) {
	for name, c := range map[string]struct {
		args []string
		msg  string
	}{
		"embedded with 2 replicas":      {[]string{"--set", "store=embedded", "--set", "replicaCount=2"}, "store=embedded runs exactly one replica"},
		"embedded with HPA":             {[]string{"--set", "store=embedded", "--set", "autoscaling.enabled=true"}, "autoscaling.enabled needs store=cql"},
		"cql without nodes":             {[]string{"--set-json", "cql.nodes=[]"}, "store=cql needs cql.nodes"},
		"local-quorum without local dc": {[]string{"--set", "cql.consistency=local-quorum"}, "needs cql.localDc"},
		"tls without a CA":              {[]string{"--set", "cql.tls.enabled=true"}, "needs cql.tls.caSecret or cql.tls.caConfigMap"},
		"grace shorter than drain":      {[]string{"--set", "terminationGracePeriodSeconds=10"}, "shorter than lifecycle.preStopSleepSeconds + server.drainTimeoutSeconds"},
		"policy number not integer":     {[]string{"--set-json", "policies.defaults.max_response_bytes=1.5"}, "schema"},
		"client CA without TLS":         {[]string{"--set", "tls.clientCA.existingSecret=ca", "--set", "auth.existingSecret=tok"}, "tls.clientCA needs tls.existingSecret"},
		"client tenants without CA":     {[]string{"--set", "tls.existingSecret=t", "--set", "tls.clientTenants.existingConfigMap=m"}, "tls.clientTenants needs tls.clientCA.existingSecret"},
		"client CA naming no tenant":    {[]string{"--set", "tls.existingSecret=t", "--set", "tls.clientCA.existingSecret=ca"}, "name no tenant"},
		"auth off by default":           {nil, "auth.allowUnauthenticated=true"},
		"auth off and tokens":           {[]string{"--set", "auth.existingSecret=tok", "--set", "auth.allowUnauthenticated=true"}, "only applies with authentication off"},
		"tenants from two sources":      {[]string{"--set", "tls.existingSecret=t", "--set", "tls.clientCA.existingSecret=ca", "--set", "tls.clientTenants.existingConfigMap=m", "--set", "tls.clientTenants.existingSecret=s"}, "set only one of tls.clientTenants"},
	} {
		t.Run(name, func(t *testing.T) {
			_, stderr, err := runHelm(templateArgs(c.args...)...)
			if err == nil {
				t.Fatal("rendered; it should be refused")
			}
			if !strings.Contains(stderr, c.msg) {
				t.Fatalf("refused without the message %q:\n%s", c.msg, stderr)
			}
		})
	}
}

// ------------------------------------------------------------------- NOTES

// TestNotes renders NOTES.txt for every scenario (helm template skips it):
// a copy of the chart defines it as a template and prints it in a ConfigMap.
func TestNotes(t *testing.T) {
	dir := t.TempDir()
	if _, stderr, err := runHelm("package", chartDir, "-d", dir); err != nil {
		t.Fatalf("helm package: %v %s", err, stderr)
	}
	files := untar(t, filepath.Join(dir, "idemd-0.1.0.tgz"))
	copyDir := filepath.Join(dir, "chart")
	for name, data := range files {
		path := filepath.Join(copyDir, strings.TrimPrefix(name, "idemd/"))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if name == "idemd/templates/NOTES.txt" {
			data = []byte(`{{- define "idemd.test.notes" -}}` + "\n" + string(data) + "\n{{- end }}")
			path = filepath.Join(copyDir, "templates", "_notes_test.tpl")
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	probe := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n  notes: {{ include \"idemd.test.notes\" . | toJson }}\n"
	if err := os.WriteFile(filepath.Join(copyDir, "templates", "zz-notes.yaml"), []byte(probe), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, file := range scenarios(t) {
		args := []string{"-f", file}
		t.Run(name, func(t *testing.T) {
			out, stderr, err := runHelm(append([]string{"template", "idemd", copyDir, "-n", "payments", "--kube-version", kubeVersion, "--show-only", "templates/zz-notes.yaml"}, args...)...)
			if err != nil {
				t.Fatalf("NOTES.txt does not render: %v\n%s", err, stderr)
			}
			var cm corev1.ConfigMap
			if err := yaml.Unmarshal([]byte(out), &cm); err != nil {
				t.Fatal(err)
			}
			notes := cm.Data["notes"]
			grpcurl := "grpcurl -plaintext"
			if name == "mtls" {
				grpcurl = "grpcurl -cacert ca.crt -servername idemd.payments.svc -cert client.crt -key client.key"
			}
			for _, want := range []string{"idemd.payments.svc.cluster.local:50051", grpcurl, "port-forward svc/idemd 50051:50051", "idemd.v1.Idempotency/Claim"} {
				if !strings.Contains(notes, want) {
					t.Errorf("NOTES lacks %q:\n%s", want, notes)
				}
			}
			if name == "mtls" && strings.Contains(notes, "-plaintext") {
				t.Errorf("NOTES of a TLS release suggest plaintext:\n%s", notes)
			}
			authOff := strings.Contains(notes, "authentication is OFF")
			hasAuth := name != "default"
			if authOff == hasAuth {
				t.Errorf("auth warning shown=%v for a release with auth=%v", authOff, hasAuth)
			}
		})
	}
}

// ---------------------------------------------------------- docs examples

// Markers in docs/deploy.md (HTML comments, invisible when rendered):
//
//	<!-- test: file NAME -->  the next fenced block is written to NAME
//	<!-- test: run -->        the next fenced block runs in bash; each
//	                          `helm install|upgrade|template` in it renders
//	                          (install/upgrade become template) and is validated
//	<!-- test: fails TEXT --> like run, but must fail with TEXT in its output
//	<!-- test: skip REASON --> the next block is not tested (say why)
//
// Every fenced block that mentions `helm ` or is YAML must have a marker, so
// an example cannot be added untested.
var marker = regexp.MustCompile(`^<!-- test: (file|run|fails|skip)\s*(.*?)\s*-->$`)

type docBlock struct {
	line       int
	kind, arg  string
	lang, body string
}

func docBlocks(t *testing.T) []docBlock {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "docs", "deploy.md"))
	if err != nil {
		t.Fatalf("docs/deploy.md: %v", err)
	}
	lines := strings.Split(string(data), "\n")
	var blocks []docBlock
	var pending *docBlock
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		if m := marker.FindStringSubmatch(line); m != nil {
			pending = &docBlock{line: i + 1, kind: m[1], arg: m[2]}
			continue
		}
		if !strings.HasPrefix(line, "```") {
			continue
		}
		lang := strings.TrimPrefix(line, "```")
		start := i + 1
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
		}
		body := strings.Join(lines[start:i], "\n") + "\n"
		if pending == nil {
			if lang == "yaml" || strings.Contains(body, "helm ") {
				t.Errorf("docs/deploy.md:%d: %s block without a test marker", start, lang)
			}
			continue
		}
		pending.lang, pending.body = lang, body
		blocks = append(blocks, *pending)
		pending = nil
	}
	return blocks
}

const docShim = `set -euo pipefail
helm() {
  local sub="$1"; shift
  local args=() a
  for a in "$@"; do
    case "$a" in --install|-i|--reset-values|--cleanup-on-fail) ;; *) args+=("$a") ;; esac
  done
  case "$sub" in
    install|template) ;;
    upgrade) args+=(--is-upgrade) ;;
    lint) "$IDEMD_HELM" lint --strict --kube-version "$KUBE_VERSION" "${args[@]}"; return ;;
    *) echo "docs test: helm $sub is not supported offline" >&2; return 1 ;;
  esac
  local out; out="$(mktemp "$RENDER_DIR/render-XXXXXX")"
  "$IDEMD_HELM" template "${args[@]}" --kube-version "$KUBE_VERSION" > "$out.yaml"
  rm -f "$out"
}
kubectl() { echo "docs test: skipped kubectl $*" >&2; }
`

func TestDocExamples(t *testing.T) {
	blocks := docBlocks(t)
	work := t.TempDir()
	if err := os.Symlink(filepath.Join(repoRoot, "helm"), filepath.Join(work, "helm")); err != nil {
		t.Fatal(err)
	}
	runs := 0
	for _, b := range blocks {
		switch b.kind {
		case "file":
			if err := os.WriteFile(filepath.Join(work, b.arg), []byte(b.body), 0o644); err != nil {
				t.Fatal(err)
			}
		case "run", "fails":
			runs++
			b := b
			t.Run(fmt.Sprintf("deploy.md:%d", b.line), func(t *testing.T) {
				renders := t.TempDir()
				cmd := exec.Command("bash", "-c", docShim+b.body)
				cmd.Dir = work
				cmd.Env = append(os.Environ(), "IDEMD_HELM="+helmBin, "KUBE_VERSION="+kubeVersion, "RENDER_DIR="+renders,
					"HELM_CACHE_HOME="+os.TempDir()+"/idemd-helm-cache", "KUBECONFIG=/dev/null")
				out, err := cmd.CombinedOutput()
				if b.kind == "fails" {
					if err == nil || !strings.Contains(string(out), b.arg) {
						t.Fatalf("should fail with %q; err=%v\n%s", b.arg, err, out)
					}
					return
				}
				if err != nil {
					t.Fatalf("%v\n%s\n%s", err, b.body, out)
				}
				files, _ := filepath.Glob(filepath.Join(renders, "*.yaml"))
				if len(files) == 0 && !strings.Contains(b.body, "helm lint") {
					t.Fatal("the example renders nothing")
				}
				for _, f := range files {
					data, err := os.ReadFile(f)
					if err != nil {
						t.Fatal(err)
					}
					mustValidate(t, string(data))
				}
			})
		}
	}
	if runs < 5 {
		t.Errorf("only %d runnable examples in docs/deploy.md", runs)
	}
}
