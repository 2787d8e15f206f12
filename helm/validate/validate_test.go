package validate

// The validator itself: a valid release passes, and each mutation of it that
// an API server (or the cluster at run time) would reject is caught.

import (
	"strings"
	"testing"
)

const validRelease = `
apiVersion: v1
kind: Service
metadata:
  name: app
  namespace: ns
  labels: {app: x}
spec:
  selector: {app: x}
  ports:
    - name: grpc
      port: 50051
      targetPort: grpc
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: app
  namespace: ns
spec:
  replicas: 2
  selector:
    matchLabels: {app: x}
  template:
    metadata:
      labels: {app: x}
    spec:
      containers:
        - name: app
          image: app:1
          ports:
            - name: grpc
              containerPort: 50051
          readinessProbe:
            grpc: {port: 50051}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
      volumes:
        - name: tmp
          emptyDir: {}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: app
  namespace: ns
spec:
  selector:
    matchLabels: {app: x}
  endpoints:
    - port: grpc
`

func problems(manifest string) string {
	docs, err := Parse([]byte(manifest))
	if err != nil {
		return err.Error()
	}
	var msgs []string
	for _, e := range Check(docs) {
		msgs = append(msgs, e.Error())
	}
	return strings.Join(msgs, "\n")
}

func TestValidReleasePasses(t *testing.T) {
	if p := problems(validRelease); p != "" {
		t.Fatal(p)
	}
}

func TestMutationsAreCaught(t *testing.T) {
	for name, c := range map[string]struct{ from, to, want string }{
		"unknown field":           {"  replicas: 2", "  replicas: 2\n  replica: 2", `unknown field "spec.replica"`},
		"field name case":         {"containerPort: 50051", "containerport: 50051", `unknown field`},
		"duplicate field":         {"  replicas: 2", "  replicas: 2\n  replicas: 3", `key "replicas" already set`},
		"wrong type":              {"replicas: 2", `replicas: "2"`, "cannot unmarshal"},
		"unknown kind":            {"kind: Deployment", "kind: Deploymnt", "no kind \"Deploymnt\""},
		"unknown CRD field":       {"    - port: grpc", "    - port: grpc\n      pathh: /m", `unknown field "spec.endpoints[0].pathh"`},
		"bad name":                {"  name: app\n  namespace: ns\nspec:\n  replicas", "  name: App_1\n  namespace: ns\nspec:\n  replicas", "metadata.name"},
		"selector mismatch":       {"    matchLabels: {app: x}\n  template", "    matchLabels: {app: w}\n  template", "does not match the template's labels"},
		"missing target port":     {"targetPort: grpc", "targetPort: grcp", "targetPort: Not found"},
		"missing volume":          {"- name: tmp\n              mountPath", "- name: temp\n              mountPath", "volumeMounts[0].name: Not found"},
		"bad port name":           {"- name: grpc\n              containerPort", "- name: grpc_port_too_long\n              containerPort", "ports[0].name"},
		"two probe handlers":      {"grpc: {port: 50051}", "grpc: {port: 50051}\n            tcpSocket: {port: 1}", "exactly one handler"},
		"no image":                {"image: app:1", "image: \"\"", "image: Required"},
		"bad label value":         {"labels: {app: x}\n    spec", "labels: {app: x, v: \"-bad-\"}\n    spec", "labels"},
		"monitor selects nothing": {"    matchLabels: {app: x}\n  endpoints", "    matchLabels: {app: z}\n  endpoints", "matches 0 rendered Services"},
		"monitor port missing":    {"    - port: grpc", "    - port: metrics", "endpoints[0].port: Not found"},
	} {
		t.Run(name, func(t *testing.T) {
			if !strings.Contains(validRelease, c.from) {
				t.Fatalf("fixture lacks %q", c.from)
			}
			got := problems(strings.Replace(validRelease, c.from, c.to, 1))
			if !strings.Contains(got, c.want) {
				t.Fatalf("want a problem containing %q, got:\n%s", c.want, got)
			}
		})
	}
}
