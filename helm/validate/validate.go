// Package validate checks rendered Kubernetes manifests offline.
//
// Why this and not kubeconform: kubeconform needs JSON schemas downloaded from
// GitHub, which this project's machines cannot reach; the Go module proxy can
// serve the API types themselves. So every document is decoded the way the
// API server decodes a request with `fieldValidation=Strict`: the
// apimachinery strict serializer (case-sensitive field names, unknown fields
// and duplicate fields are errors, wrong types are errors) into the typed
// structs of k8s.io/api and of the Prometheus Operator
// (monitoring.coreos.com/v1). A kind outside that scheme is an error too.
//
// Strict decoding proves the shape, not the semantics the API server checks
// after it (required fields, name formats, references). Check adds the
// subset of those that a chart can get wrong: object and label names (with
// apimachinery's own validation functions), selectors that match their pods,
// named ports and volumes that exist, probe and lifecycle handlers, resource
// requests within limits, and references between the rendered objects
// (Service -> pods, HPA -> Deployment, PDB/NetworkPolicy -> pods,
// ServiceMonitor -> Service port).
package validate

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Doc is one decoded document of a rendered manifest stream.
type Doc struct {
	Source string // template path from the "# Source:" comment
	Raw    []byte
	GVK    schema.GroupVersionKind
	Obj    runtime.Object
}

// Name is "Kind/name" for messages.
func (d Doc) Name() string {
	m, err := metaOf(d.Obj)
	if err != nil {
		return d.GVK.Kind + "/?"
	}
	return d.GVK.Kind + "/" + m.GetName()
}

var (
	scheme  = runtime.NewScheme()
	decoder runtime.Decoder
)

func init() {
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme,
		policyv1.AddToScheme, autoscalingv2.AddToScheme, networkingv1.AddToScheme,
		rbacv1.AddToScheme, monitoringv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	decoder = serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}

var sourceRe = regexp.MustCompile(`(?m)^# Source: (.+)$`)

// Parse splits a multi-document YAML stream and strictly decodes each
// non-empty document. All problems are returned, not just the first.
func Parse(data []byte) ([]Doc, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs []Doc
	var errs []error
	for i := 0; ; i++ {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if isBlank(raw) {
			continue
		}
		source := ""
		if m := sourceRe.FindSubmatch(raw); m != nil {
			source = string(m[1])
		}
		obj, gvk, err := decoder.Decode(raw, nil, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s (document %d): %w", source, i, err))
			continue
		}
		docs = append(docs, Doc{Source: source, Raw: raw, GVK: *gvk, Obj: obj})
	}
	return docs, errors.Join(errs...)
}

func isBlank(raw []byte) bool {
	for _, line := range strings.Split(string(raw), "\n") {
		t := strings.TrimSpace(line)
		if t != "" && !strings.HasPrefix(t, "#") && t != "---" {
			return false
		}
	}
	return true
}

func metaOf(obj runtime.Object) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no metadata", obj)
	}
	return m, nil
}

// Workload is a pod template with where it came from.
type Workload struct {
	Doc      Doc
	Template *corev1.PodTemplateSpec
	Claims   []corev1.PersistentVolumeClaim // StatefulSet volumeClaimTemplates
}

// Workloads returns the pod templates of Deployments, StatefulSets and Jobs.
func Workloads(docs []Doc) []Workload {
	var out []Workload
	for _, d := range docs {
		switch o := d.Obj.(type) {
		case *appsv1.Deployment:
			out = append(out, Workload{Doc: d, Template: &o.Spec.Template})
		case *appsv1.StatefulSet:
			out = append(out, Workload{Doc: d, Template: &o.Spec.Template, Claims: o.Spec.VolumeClaimTemplates})
		case *batchv1.Job:
			out = append(out, Workload{Doc: d, Template: &o.Spec.Template})
		}
	}
	return out
}

// Check runs the semantic checks over one rendered release.
func Check(docs []Doc) []error {
	var errs []error
	add := func(d Doc, list field.ErrorList) {
		for _, e := range list {
			errs = append(errs, fmt.Errorf("%s (%s): %s", d.Name(), d.Source, e.Error()))
		}
	}
	seen := map[string]bool{}
	for _, d := range docs {
		key := d.GVK.String() + "/" + d.Name()
		if seen[key] {
			errs = append(errs, fmt.Errorf("%s rendered twice", d.Name()))
		}
		seen[key] = true
		m, err := metaOf(d.Obj)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		nameFn := apivalidation.NameIsDNSSubdomain
		if d.GVK.Kind == "Service" {
			nameFn = apivalidation.NameIsDNS1035Label
		}
		om, ok := m.(*metav1.ObjectMeta)
		if !ok {
			if acc, ok2 := d.Obj.(interface{ GetObjectMeta() metav1.Object }); ok2 {
				om, _ = acc.GetObjectMeta().(*metav1.ObjectMeta)
			}
		}
		if om != nil {
			add(d, apivalidation.ValidateObjectMeta(om, true, nameFn, field.NewPath("metadata")))
		}
		if d.GVK.Kind == "" || d.GVK.Version == "" {
			errs = append(errs, fmt.Errorf("%s: apiVersion/kind missing", d.Source))
		}
	}
	workloads := Workloads(docs)
	for _, w := range workloads {
		add(w.Doc, checkWorkload(w))
	}
	for _, d := range docs {
		switch o := d.Obj.(type) {
		case *corev1.Service:
			add(d, checkService(o, workloads))
		case *autoscalingv2.HorizontalPodAutoscaler:
			add(d, checkHPA(o, docs))
		case *policyv1.PodDisruptionBudget:
			add(d, checkSelects(field.NewPath("spec", "selector"), o.Spec.Selector, workloads))
		case *networkingv1.NetworkPolicy:
			add(d, checkNetworkPolicy(o, workloads))
		case *monitoringv1.ServiceMonitor:
			add(d, checkServiceMonitor(o, docs))
		case *monitoringv1.PrometheusRule:
			add(d, checkPrometheusRule(o))
		case *corev1.ConfigMap:
			for k := range o.Data {
				for _, msg := range validation.IsConfigMapKey(k) {
					add(d, field.ErrorList{field.Invalid(field.NewPath("data").Key(k), k, msg)})
				}
			}
		}
	}
	return errs
}

func podLabelsMatch(sel *metav1.LabelSelector, w Workload) (bool, error) {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false, err
	}
	return s.Matches(labels.Set(w.Template.Labels)), nil
}

func checkSelects(path *field.Path, sel *metav1.LabelSelector, workloads []Workload) field.ErrorList {
	if sel == nil || (len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0) {
		return field.ErrorList{field.Required(path, "a selector that is not empty")}
	}
	for _, w := range workloads {
		if ok, err := podLabelsMatch(sel, w); err != nil {
			return field.ErrorList{field.Invalid(path, sel, err.Error())}
		} else if ok {
			return nil
		}
	}
	return field.ErrorList{field.Invalid(path, sel, "selects no rendered pod template")}
}

func checkWorkload(w Workload) field.ErrorList {
	var errs field.ErrorList
	spec := &w.Template.Spec
	tpath := field.NewPath("spec", "template")
	errs = append(errs, metav1validation.ValidateLabels(w.Template.Labels, tpath.Child("metadata", "labels"))...)
	errs = append(errs, apivalidation.ValidateAnnotations(w.Template.Annotations, tpath.Child("metadata", "annotations"))...)
	switch o := w.Doc.Obj.(type) {
	case *appsv1.Deployment:
		errs = append(errs, selectorMatchesTemplate(o.Spec.Selector, w)...)
	case *appsv1.StatefulSet:
		errs = append(errs, selectorMatchesTemplate(o.Spec.Selector, w)...)
		if o.Spec.ServiceName == "" {
			errs = append(errs, field.Required(field.NewPath("spec", "serviceName"), ""))
		}
		for i, c := range o.Spec.VolumeClaimTemplates {
			p := field.NewPath("spec", "volumeClaimTemplates").Index(i)
			if len(c.Spec.AccessModes) == 0 {
				errs = append(errs, field.Required(p.Child("spec", "accessModes"), ""))
			}
			if _, ok := c.Spec.Resources.Requests[corev1.ResourceStorage]; !ok {
				errs = append(errs, field.Required(p.Child("spec", "resources", "requests", "storage"), ""))
			}
		}
	case *batchv1.Job:
		rp := spec.RestartPolicy
		if rp != corev1.RestartPolicyNever && rp != corev1.RestartPolicyOnFailure {
			errs = append(errs, field.NotSupported(tpath.Child("spec", "restartPolicy"), rp, []string{"Never", "OnFailure"}))
		}
		if pfp := o.Spec.PodFailurePolicy; pfp != nil {
			if rp != corev1.RestartPolicyNever {
				errs = append(errs, field.Invalid(tpath.Child("spec", "restartPolicy"), rp, "podFailurePolicy requires Never"))
			}
			for i, r := range pfp.Rules {
				if r.OnExitCodes != nil && r.OnExitCodes.ContainerName != nil && !hasContainer(spec, *r.OnExitCodes.ContainerName) {
					errs = append(errs, field.NotFound(field.NewPath("spec", "podFailurePolicy", "rules").Index(i).Child("onExitCodes", "containerName"), *r.OnExitCodes.ContainerName))
				}
			}
		}
	}
	errs = append(errs, checkPodSpec(spec, w.Claims, tpath.Child("spec"))...)
	return errs
}

func hasContainer(spec *corev1.PodSpec, name string) bool {
	for _, c := range spec.Containers {
		if c.Name == name {
			return true
		}
	}
	return false
}

func selectorMatchesTemplate(sel *metav1.LabelSelector, w Workload) field.ErrorList {
	p := field.NewPath("spec", "selector")
	if sel == nil || len(sel.MatchLabels)+len(sel.MatchExpressions) == 0 {
		return field.ErrorList{field.Required(p, "")}
	}
	ok, err := podLabelsMatch(sel, w)
	if err != nil {
		return field.ErrorList{field.Invalid(p, sel, err.Error())}
	}
	if !ok {
		return field.ErrorList{field.Invalid(p, sel, "does not match the template's labels")}
	}
	return nil
}

func checkPodSpec(spec *corev1.PodSpec, claims []corev1.PersistentVolumeClaim, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	volumes := map[string]bool{}
	for i, v := range spec.Volumes {
		vp := p.Child("volumes").Index(i)
		for _, msg := range validation.IsDNS1123Label(v.Name) {
			errs = append(errs, field.Invalid(vp.Child("name"), v.Name, msg))
		}
		if volumes[v.Name] {
			errs = append(errs, field.Duplicate(vp.Child("name"), v.Name))
		}
		volumes[v.Name] = true
		sources := 0
		if v.ConfigMap != nil {
			sources++
			if v.ConfigMap.Name == "" {
				errs = append(errs, field.Required(vp.Child("configMap", "name"), ""))
			}
		}
		if v.Secret != nil {
			sources++
			if v.Secret.SecretName == "" {
				errs = append(errs, field.Required(vp.Child("secret", "secretName"), ""))
			}
		}
		if v.EmptyDir != nil {
			sources++
		}
		if v.PersistentVolumeClaim != nil {
			sources++
		}
		if v.Projected != nil {
			sources++
		}
		if sources != 1 {
			errs = append(errs, field.Invalid(vp, v.Name, fmt.Sprintf("needs exactly one volume source (has %d of those this check knows)", sources)))
		}
	}
	for _, c := range claims {
		if volumes[c.Name] {
			errs = append(errs, field.Duplicate(p.Child("volumes"), c.Name))
		}
		volumes[c.Name] = true
	}
	if len(spec.Containers) == 0 {
		errs = append(errs, field.Required(p.Child("containers"), ""))
	}
	names := map[string]bool{}
	for i, c := range spec.Containers {
		cp := p.Child("containers").Index(i)
		for _, msg := range validation.IsDNS1123Label(c.Name) {
			errs = append(errs, field.Invalid(cp.Child("name"), c.Name, msg))
		}
		if names[c.Name] {
			errs = append(errs, field.Duplicate(cp.Child("name"), c.Name))
		}
		names[c.Name] = true
		if strings.TrimSpace(c.Image) == "" {
			errs = append(errs, field.Required(cp.Child("image"), ""))
		}
		ports := map[string]bool{}
		for j, port := range c.Ports {
			pp := cp.Child("ports").Index(j)
			if port.Name != "" {
				for _, msg := range validation.IsValidPortName(port.Name) {
					errs = append(errs, field.Invalid(pp.Child("name"), port.Name, msg))
				}
				if ports[port.Name] {
					errs = append(errs, field.Duplicate(pp.Child("name"), port.Name))
				}
				ports[port.Name] = true
			}
			for _, msg := range validation.IsValidPortNum(int(port.ContainerPort)) {
				errs = append(errs, field.Invalid(pp.Child("containerPort"), port.ContainerPort, msg))
			}
		}
		for j, e := range c.Env {
			ep := cp.Child("env").Index(j)
			for _, msg := range validation.IsEnvVarName(e.Name) {
				errs = append(errs, field.Invalid(ep.Child("name"), e.Name, msg))
			}
			if e.ValueFrom != nil {
				if e.Value != "" {
					errs = append(errs, field.Invalid(ep, e.Name, "value and valueFrom are exclusive"))
				}
				if r := e.ValueFrom.SecretKeyRef; r != nil && (r.Name == "" || r.Key == "") {
					errs = append(errs, field.Required(ep.Child("valueFrom", "secretKeyRef"), "name and key"))
				}
			}
		}
		mounts := map[string]bool{}
		for j, m := range c.VolumeMounts {
			mp := cp.Child("volumeMounts").Index(j)
			if !volumes[m.Name] {
				errs = append(errs, field.NotFound(mp.Child("name"), m.Name))
			}
			if !strings.HasPrefix(m.MountPath, "/") {
				errs = append(errs, field.Invalid(mp.Child("mountPath"), m.MountPath, "must be absolute"))
			}
			if mounts[m.MountPath] {
				errs = append(errs, field.Duplicate(mp.Child("mountPath"), m.MountPath))
			}
			mounts[m.MountPath] = true
		}
		for name, probe := range map[string]*corev1.Probe{"startupProbe": c.StartupProbe, "readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
			if probe == nil {
				continue
			}
			pp := cp.Child(name)
			h := probe.ProbeHandler
			n := 0
			for _, set := range []bool{h.Exec != nil, h.HTTPGet != nil, h.TCPSocket != nil, h.GRPC != nil} {
				if set {
					n++
				}
			}
			if n != 1 {
				errs = append(errs, field.Invalid(pp, n, "needs exactly one handler"))
			}
			if h.GRPC != nil {
				for _, msg := range validation.IsValidPortNum(int(h.GRPC.Port)) {
					errs = append(errs, field.Invalid(pp.Child("grpc", "port"), h.GRPC.Port, msg))
				}
			}
			if name == "livenessProbe" || name == "startupProbe" {
				if probe.SuccessThreshold > 1 {
					errs = append(errs, field.Invalid(pp.Child("successThreshold"), probe.SuccessThreshold, "must be 1"))
				}
			}
		}
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
			h := c.Lifecycle.PreStop
			n := 0
			for _, set := range []bool{h.Exec != nil, h.HTTPGet != nil, h.TCPSocket != nil, h.Sleep != nil} {
				if set {
					n++
				}
			}
			if n != 1 {
				errs = append(errs, field.Invalid(cp.Child("lifecycle", "preStop"), n, "needs exactly one handler"))
			}
			if h.Sleep != nil && spec.TerminationGracePeriodSeconds != nil && h.Sleep.Seconds > *spec.TerminationGracePeriodSeconds {
				errs = append(errs, field.Invalid(cp.Child("lifecycle", "preStop", "sleep", "seconds"), h.Sleep.Seconds, "longer than terminationGracePeriodSeconds"))
			}
		}
		for res, limit := range c.Resources.Limits {
			if req, ok := c.Resources.Requests[res]; ok && req.Cmp(limit) > 0 {
				errs = append(errs, field.Invalid(cp.Child("resources", "requests").Key(string(res)), req.String(), "must be less than or equal to the limit "+limit.String()))
			}
		}
	}
	for i, t := range spec.TopologySpreadConstraints {
		tp := p.Child("topologySpreadConstraints").Index(i)
		if t.MaxSkew <= 0 {
			errs = append(errs, field.Invalid(tp.Child("maxSkew"), t.MaxSkew, "must be > 0"))
		}
		if t.WhenUnsatisfiable != corev1.DoNotSchedule && t.WhenUnsatisfiable != corev1.ScheduleAnyway {
			errs = append(errs, field.NotSupported(tp.Child("whenUnsatisfiable"), t.WhenUnsatisfiable, []string{"DoNotSchedule", "ScheduleAnyway"}))
		}
		if t.TopologyKey == "" {
			errs = append(errs, field.Required(tp.Child("topologyKey"), ""))
		}
		if t.LabelSelector != nil {
			for _, k := range t.MatchLabelKeys {
				if _, clash := t.LabelSelector.MatchLabels[k]; clash {
					errs = append(errs, field.Invalid(tp.Child("matchLabelKeys"), k, "also in labelSelector"))
				}
			}
		}
	}
	return errs
}

func containerPortNames(w Workload) map[string]bool {
	out := map[string]bool{}
	for _, c := range w.Template.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name != "" {
				out[p.Name] = true
			}
		}
	}
	return out
}

func checkService(s *corev1.Service, workloads []Workload) field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("spec")
	if len(s.Spec.Ports) == 0 {
		errs = append(errs, field.Required(p.Child("ports"), ""))
	}
	names := map[string]bool{}
	for i, port := range s.Spec.Ports {
		pp := p.Child("ports").Index(i)
		if len(s.Spec.Ports) > 1 && port.Name == "" {
			errs = append(errs, field.Required(pp.Child("name"), "every port of a multi-port Service needs a name"))
		}
		for _, msg := range validation.IsDNS1123Label(port.Name) {
			errs = append(errs, field.Invalid(pp.Child("name"), port.Name, msg))
		}
		if names[port.Name] {
			errs = append(errs, field.Duplicate(pp.Child("name"), port.Name))
		}
		names[port.Name] = true
		for _, msg := range validation.IsValidPortNum(int(port.Port)) {
			errs = append(errs, field.Invalid(pp.Child("port"), port.Port, msg))
		}
	}
	if len(s.Spec.Selector) == 0 {
		return append(errs, field.Required(p.Child("selector"), "this chart's Services select its pods"))
	}
	var matched []Workload
	for _, w := range workloads {
		if labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(w.Template.Labels)) {
			matched = append(matched, w)
		}
	}
	if len(matched) == 0 {
		return append(errs, field.Invalid(p.Child("selector"), s.Spec.Selector, "selects no rendered pod template"))
	}
	for i, port := range s.Spec.Ports {
		if port.TargetPort.Type != intstr.String {
			continue
		}
		for _, w := range matched {
			if !containerPortNames(w)[port.TargetPort.StrVal] {
				errs = append(errs, field.NotFound(p.Child("ports").Index(i).Child("targetPort"), port.TargetPort.StrVal+" in "+w.Doc.Name()))
			}
		}
	}
	return errs
}

func checkHPA(h *autoscalingv2.HorizontalPodAutoscaler, docs []Doc) field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("spec")
	if h.Spec.MinReplicas != nil && *h.Spec.MinReplicas > h.Spec.MaxReplicas {
		errs = append(errs, field.Invalid(p.Child("minReplicas"), *h.Spec.MinReplicas, "greater than maxReplicas"))
	}
	ref := h.Spec.ScaleTargetRef
	for _, d := range docs {
		if dep, ok := d.Obj.(*appsv1.Deployment); ok && ref.Kind == "Deployment" && ref.APIVersion == "apps/v1" && dep.Name == ref.Name {
			if dep.Spec.Replicas != nil {
				errs = append(errs, field.Invalid(field.NewPath("Deployment", "spec", "replicas"), *dep.Spec.Replicas, "set although an HPA owns the replica count (every upgrade would reset it)"))
			}
			for _, c := range dep.Spec.Template.Spec.Containers {
				if _, ok := c.Resources.Requests[corev1.ResourceCPU]; !ok {
					errs = append(errs, field.Required(field.NewPath("Deployment", "containers", c.Name, "resources", "requests", "cpu"), "CPU utilization needs a request"))
				}
			}
			return errs
		}
	}
	return append(errs, field.NotFound(p.Child("scaleTargetRef"), ref.Kind+"/"+ref.Name))
}

func checkNetworkPolicy(n *networkingv1.NetworkPolicy, workloads []Workload) field.ErrorList {
	errs := checkSelects(field.NewPath("spec", "podSelector"), &n.Spec.PodSelector, workloads)
	named := map[string]bool{}
	for _, w := range workloads {
		if ok, _ := podLabelsMatch(&n.Spec.PodSelector, w); ok {
			for name := range containerPortNames(w) {
				named[name] = true
			}
		}
	}
	for i, r := range n.Spec.Ingress {
		for j, port := range r.Ports {
			if port.Port != nil && port.Port.Type == intstr.String && !named[port.Port.StrVal] {
				errs = append(errs, field.NotFound(field.NewPath("spec", "ingress").Index(i).Child("ports").Index(j), port.Port.StrVal))
			}
		}
	}
	return errs
}

func checkServiceMonitor(sm *monitoringv1.ServiceMonitor, docs []Doc) field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("spec")
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		return field.ErrorList{field.Invalid(p.Child("selector"), sm.Spec.Selector, err.Error())}
	}
	var matched []*corev1.Service
	for _, d := range docs {
		if s, ok := d.Obj.(*corev1.Service); ok && sel.Matches(labels.Set(s.Labels)) {
			matched = append(matched, s)
		}
	}
	if len(matched) != 1 {
		return append(errs, field.Invalid(p.Child("selector"), sm.Spec.Selector, fmt.Sprintf("matches %d rendered Services; exactly one avoids scraping every pod twice", len(matched))))
	}
	for i, ep := range sm.Spec.Endpoints {
		found := false
		for _, port := range matched[0].Spec.Ports {
			if port.Name == ep.Port {
				found = true
			}
		}
		if !found {
			errs = append(errs, field.NotFound(p.Child("endpoints").Index(i).Child("port"), ep.Port))
		}
	}
	return errs
}

var promDuration = regexp.MustCompile(`^(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?$`)

func checkPrometheusRule(r *monitoringv1.PrometheusRule) field.ErrorList {
	var errs field.ErrorList
	groups := map[string]bool{}
	if len(r.Spec.Groups) == 0 {
		errs = append(errs, field.Required(field.NewPath("spec", "groups"), ""))
	}
	for i, g := range r.Spec.Groups {
		gp := field.NewPath("spec", "groups").Index(i)
		if g.Name == "" || groups[g.Name] {
			errs = append(errs, field.Invalid(gp.Child("name"), g.Name, "empty or duplicate group name"))
		}
		groups[g.Name] = true
		for j, rule := range g.Rules {
			rp := gp.Child("rules").Index(j)
			if (rule.Record == "") == (rule.Alert == "") {
				errs = append(errs, field.Invalid(rp, rule.Record+rule.Alert, "exactly one of record and alert"))
			}
			if rule.Expr.String() == "" {
				errs = append(errs, field.Required(rp.Child("expr"), ""))
			}
			if rule.For != nil && (*rule.For == "" || !promDuration.MatchString(string(*rule.For))) {
				errs = append(errs, field.Invalid(rp.Child("for"), *rule.For, "not a Prometheus duration"))
			}
		}
	}
	return errs
}
