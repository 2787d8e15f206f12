{{/*
Names and labels.
*/}}
{{- define "idemd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "idemd.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of the headless Service (<= 63 characters). */}}
{{- define "idemd.headlessName" -}}
{{- printf "%s-headless" (include "idemd.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{- define "idemd.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "idemd.labels" -}}
helm.sh/chart: {{ include "idemd.chart" . }}
{{ include "idemd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: idemd
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Every pod of the release (server and migration Job). */}}
{{- define "idemd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "idemd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The server pods only (Services, PDB, spread, HPA target). */}}
{{- define "idemd.serverSelectorLabels" -}}
{{ include "idemd.selectorLabels" . }}
app.kubernetes.io/component: server
{{- end }}

{{- define "idemd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "idemd.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "idemd.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
Replicas after the store's rules: embedded is exactly one process.
*/}}
{{- define "idemd.replicas" -}}
{{- if eq .Values.store "embedded" }}
{{- if and (not (kindIs "invalid" .Values.replicaCount)) (gt (int .Values.replicaCount) 1) }}
{{- fail (printf "store=embedded runs exactly one replica (one process owns the data file), but replicaCount=%v: use store=cql to scale out" .Values.replicaCount) }}
{{- end }}
{{- 1 }}
{{- else if kindIs "invalid" .Values.replicaCount }}
{{- 3 }}
{{- else }}
{{- int .Values.replicaCount }}
{{- end }}
{{- end }}

{{/*
Checks of combinations the schema cannot express; rendered by every workload.
*/}}
{{- define "idemd.validate" -}}
{{- if eq .Values.store "embedded" }}
{{- $_ := include "idemd.replicas" . }}
{{- if .Values.autoscaling.enabled }}
{{- fail "autoscaling.enabled needs store=cql: store=embedded runs exactly one replica" }}
{{- end }}
{{- else }}
{{- if not .Values.cql.nodes }}
{{- fail "store=cql needs cql.nodes (host:port contact points of the ScyllaDB/Cassandra cluster)" }}
{{- end }}
{{- if and (eq .Values.cql.consistency "local-quorum") (not .Values.cql.localDc) }}
{{- fail "cql.consistency=local-quorum needs cql.localDc (the datacenter this deployment runs in)" }}
{{- end }}
{{- if and .Values.cql.tls.enabled (not (or .Values.cql.tls.caSecret .Values.cql.tls.caConfigMap)) }}
{{- fail "cql.tls.enabled needs cql.tls.caSecret or cql.tls.caConfigMap (the PEM CA bundle of the cluster)" }}
{{- end }}
{{- if and .Values.cql.tls.caSecret .Values.cql.tls.caConfigMap }}
{{- fail "set only one of cql.tls.caSecret and cql.tls.caConfigMap" }}
{{- end }}
{{- end }}
{{- if and .Values.tls.clientCA.existingSecret (not .Values.tls.existingSecret) }}
{{- fail "tls.clientCA needs tls.existingSecret (the server certificate): mTLS is TLS with client certificates" }}
{{- end }}
{{- if and .Values.tls.clientTenants.existingConfigMap .Values.tls.clientTenants.existingSecret }}
{{- fail "set only one of tls.clientTenants.existingConfigMap and tls.clientTenants.existingSecret" }}
{{- end }}
{{- $clientTenants := or .Values.tls.clientTenants.existingConfigMap .Values.tls.clientTenants.existingSecret }}
{{- if and $clientTenants (not .Values.tls.clientCA.existingSecret) }}
{{- fail "tls.clientTenants needs tls.clientCA.existingSecret: only verified client certificates may name a tenant" }}
{{- end }}
{{- if and .Values.tls.clientCA.existingSecret (not $clientTenants) (not .Values.auth.existingSecret) }}
{{- fail "tls.clientCA without tls.clientTenants or auth.existingSecret: client certificates would be verified but name no tenant" }}
{{- end }}
{{- $minGrace := add .Values.lifecycle.preStopSleepSeconds .Values.server.drainTimeoutSeconds }}
{{- if and (not (kindIs "invalid" .Values.terminationGracePeriodSeconds)) (lt (int .Values.terminationGracePeriodSeconds) (int $minGrace)) }}
{{- fail (printf "terminationGracePeriodSeconds=%v is shorter than lifecycle.preStopSleepSeconds + server.drainTimeoutSeconds = %d: the kubelet would kill in-flight requests" .Values.terminationGracePeriodSeconds (int $minGrace)) }}
{{- end }}
{{- /* Last, so a values file with another mistake is told about that one. */}}
{{- $authenticated := or .Values.auth.existingSecret $clientTenants }}
{{- if and (not $authenticated) (not .Values.auth.allowUnauthenticated) }}
{{- fail "authentication is off: set auth.existingSecret (bearer tokens) or tls.clientTenants (mTLS), or set auth.allowUnauthenticated=true to let every caller that reaches the pods pick any tenant with x-tenant-id (development only)" }}
{{- end }}
{{- if and $authenticated .Values.auth.allowUnauthenticated }}
{{- fail "auth.allowUnauthenticated=true only applies with authentication off: remove it when auth.existingSecret or tls.clientTenants is set" }}
{{- end }}
{{- end }}

{{- define "idemd.terminationGracePeriodSeconds" -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add .Values.lifecycle.preStopSleepSeconds .Values.server.drainTimeoutSeconds 5 }}
{{- else }}
{{- int .Values.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/*
CQL connection environment, shared by the server and `idemd migrate`.
*/}}
{{- define "idemd.cqlEnv" -}}
- name: IDEMD_CQL_NODES
  value: {{ join "," .Values.cql.nodes | quote }}
- name: IDEMD_KEYSPACE
  value: {{ .Values.cql.keyspace | quote }}
- name: IDEMD_CQL_CONSISTENCY
  value: {{ .Values.cql.consistency | quote }}
{{- with .Values.cql.localDc }}
- name: IDEMD_CQL_LOCAL_DC
  value: {{ . | quote }}
{{- end }}
- name: IDEMD_CQL_REQUEST_TIMEOUT
  value: {{ .Values.cql.requestTimeout | quote }}
{{- with .Values.cql.lwtTimeout }}
- name: IDEMD_CQL_LWT_TIMEOUT
  value: {{ . | quote }}
{{- end }}
{{- with .Values.cql.auth.existingSecret }}
- name: IDEMD_CQL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ . | quote }}
      key: {{ $.Values.cql.auth.usernameKey | quote }}
- name: IDEMD_CQL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ . | quote }}
      key: {{ $.Values.cql.auth.passwordKey | quote }}
{{- end }}
{{- if .Values.cql.tls.enabled }}
- name: IDEMD_CQL_TLS_CA
  value: {{ printf "/etc/idemd/cql-tls/%s" .Values.cql.tls.caKey | quote }}
{{- end }}
{{- end }}

{{- define "idemd.cqlTlsVolumeMount" -}}
{{- if .Values.cql.tls.enabled }}
- name: cql-tls
  mountPath: /etc/idemd/cql-tls
  readOnly: true
{{- end }}
{{- end }}

{{- define "idemd.cqlTlsVolume" -}}
{{- if .Values.cql.tls.enabled }}
- name: cql-tls
{{- if .Values.cql.tls.caSecret }}
  secret:
    secretName: {{ .Values.cql.tls.caSecret | quote }}
    items:
      - key: {{ .Values.cql.tls.caKey | quote }}
        path: {{ .Values.cql.tls.caKey | quote }}
{{- else }}
  configMap:
    name: {{ .Values.cql.tls.caConfigMap | quote }}
    items:
      - key: {{ .Values.cql.tls.caKey | quote }}
        path: {{ .Values.cql.tls.caKey | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A TOML value: strings and lists as JSON (valid TOML), whole numbers as
integers (values arrive as float64), booleans as is.
*/}}
{{- define "idemd.tomlValue" -}}
{{- if kindIs "string" . }}
{{- toJson . }}
{{- else if kindIs "bool" . }}
{{- ternary "true" "false" . }}
{{- else if or (kindIs "float64" .) (kindIs "int" .) (kindIs "int64" .) }}
{{- if ne (float64 (int64 .)) (float64 .) }}
{{- fail (printf "policies: %v is not an integer" .) }}
{{- end }}
{{- int64 . }}
{{- else if kindIs "slice" . }}
{{- toJson . }}
{{- else }}
{{- fail (printf "policies: cannot render %v (%s) as TOML" . (kindOf .)) }}
{{- end }}
{{- end }}

{{- define "idemd.tomlTable" -}}
{{- range $key, $value := . }}
{{ $key }} = {{ include "idemd.tomlValue" $value }}
{{- end }}
{{- end }}

{{- define "idemd.policiesToml" -}}
# Rendered by the idemd Helm chart from .Values.policies.
[defaults]
{{- include "idemd.tomlTable" .Values.policies.defaults }}
{{- range $endpoint, $policy := .Values.policies.endpoints }}
[endpoints.{{ toJson $endpoint }}]
{{- include "idemd.tomlTable" $policy }}
{{- end }}
{{ end }}

{{/*
The server pod template, shared by the Deployment (cql) and the StatefulSet
(embedded).
*/}}
{{- define "idemd.podTemplate" -}}
metadata:
  labels:
    {{- include "idemd.serverSelectorLabels" . | nindent 4 }}
    app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ include "idemd.policiesToml" . | sha256sum }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "idemd.serviceAccountName" . }}
  automountServiceAccountToken: {{ .Values.automountServiceAccountToken }}
  terminationGracePeriodSeconds: {{ include "idemd.terminationGracePeriodSeconds" . }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . | quote }}
  {{- end }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  containers:
    - name: idemd
      image: {{ include "idemd.image" . | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      {{- if .Values.proxy.enabled }}
      {{- /* idemd proxy in front of the application container(s) of
      extraContainers; gRPC stays on (IDEMD_GRPC_LISTEN) for the probes and
      for operators' ListPending/Reconcile. docs/proxy.md. */}}
      args: ["proxy"]
      {{- else }}
      args: ["serve"]
      {{- end }}
      env:
        - name: IDEMD_STORE
          value: {{ .Values.store | quote }}
        {{- if .Values.proxy.enabled }}
        - name: IDEMD_GRPC_LISTEN
          value: {{ printf "0.0.0.0:%d" (int .Values.ports.grpc) | quote }}
        - name: IDEMD_PROXY_LISTEN
          value: {{ printf "0.0.0.0:%d" (int .Values.proxy.port) | quote }}
        - name: IDEMD_UPSTREAM
          value: {{ required "proxy.upstream is required with proxy.enabled" .Values.proxy.upstream | quote }}
        - name: IDEMD_PROXY_TOKEN_HEADER
          value: {{ .Values.proxy.tokenHeader | quote }}
        {{- if .Values.proxy.routes }}
        - name: IDEMD_PROXY_ROUTES
          value: /etc/idemd/config/routes.toml
        {{- end }}
        {{- else }}
        - name: IDEMD_LISTEN
          value: {{ printf "0.0.0.0:%d" (int .Values.ports.grpc) | quote }}
        {{- end }}
        - name: IDEMD_METRICS_LISTEN
          value: {{ printf "0.0.0.0:%d" (int .Values.ports.metrics) | quote }}
        - name: IDEMD_CONFIG
          value: /etc/idemd/config/policies.toml
        - name: IDEMD_LOG_FORMAT
          value: {{ .Values.server.logFormat | quote }}
        - name: IDEMD_LOG
          value: {{ .Values.server.logLevel | quote }}
        - name: IDEMD_DRAIN_TIMEOUT
          value: {{ printf "%ds" (int .Values.server.drainTimeoutSeconds) | quote }}
        - name: IDEMD_CACHE_BYTES
          value: {{ int64 .Values.server.cacheBytes | quote }}
        {{- if eq .Values.store "embedded" }}
        - name: IDEMD_STORE_CACHE_BYTES
          value: {{ int64 .Values.server.storeCacheBytes | quote }}
        {{- end }}
        - name: IDEMD_AUDIT_RETENTION
          value: {{ .Values.server.auditRetention | quote }}
        {{- with .Values.server.otlpEndpoint }}
        - name: OTEL_EXPORTER_OTLP_ENDPOINT
          value: {{ . | quote }}
        - name: OTEL_SERVICE_NAME
          value: {{ include "idemd.fullname" $ | quote }}
        {{- end }}
        {{- if .Values.auth.existingSecret }}
        - name: IDEMD_AUTH_TOKENS
          value: {{ printf "/etc/idemd/auth/%s" .Values.auth.key | quote }}
        {{- end }}
        {{- if .Values.auth.allowUnauthenticated }}
        - name: IDEMD_ALLOW_UNAUTHENTICATED_REMOTE
          value: "true"
        {{- end }}
        {{- if .Values.tls.existingSecret }}
        - name: IDEMD_TLS_CERT
          value: /etc/idemd/tls/tls.crt
        - name: IDEMD_TLS_KEY
          value: /etc/idemd/tls/tls.key
        {{- end }}
        {{- if .Values.tls.clientCA.existingSecret }}
        - name: IDEMD_TLS_CLIENT_CA
          value: {{ printf "/etc/idemd/tls-client-ca/%s" .Values.tls.clientCA.key | quote }}
        {{- end }}
        {{- if or .Values.tls.clientTenants.existingConfigMap .Values.tls.clientTenants.existingSecret }}
        - name: IDEMD_TLS_CLIENT_TENANTS
          value: {{ printf "/etc/idemd/tls-client-tenants/%s" .Values.tls.clientTenants.key | quote }}
        {{- end }}
        {{- if .Values.encryption.existingSecret }}
        - name: IDEMD_ENCRYPTION_KEYS
          value: {{ printf "/etc/idemd/encryption/%s" .Values.encryption.key | quote }}
        {{- end }}
        {{- if eq .Values.store "embedded" }}
        - name: IDEMD_DATA_DIR
          value: /var/lib/idemd
        - name: IDEMD_SWEEP_INTERVAL
          value: {{ .Values.embedded.sweepInterval | quote }}
        {{- else }}
        {{- include "idemd.cqlEnv" . | nindent 8 }}
        {{- end }}
        {{- with .Values.server.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - name: grpc
          containerPort: {{ .Values.ports.grpc }}
          protocol: TCP
        - name: metrics
          containerPort: {{ .Values.ports.metrics }}
          protocol: TCP
        {{- if .Values.proxy.enabled }}
        - name: proxy
          containerPort: {{ .Values.proxy.port }}
          protocol: TCP
        {{- end }}
      {{- if .Values.tls.existingSecret }}
      {{- /* The kubelet's gRPC probes cannot speak TLS (nor present a client
      certificate): with TLS the probes only check that the port accepts
      connections. docs/security.md, "Kubernetes probes". */}}
      startupProbe:
        tcpSocket:
          port: {{ .Values.ports.grpc }}
        {{- toYaml .Values.probes.startup | nindent 8 }}
      readinessProbe:
        tcpSocket:
          port: {{ .Values.ports.grpc }}
        {{- toYaml .Values.probes.readiness | nindent 8 }}
      livenessProbe:
        tcpSocket:
          port: {{ .Values.ports.grpc }}
        {{- toYaml .Values.probes.liveness | nindent 8 }}
      {{- else }}
      startupProbe:
        grpc:
          port: {{ .Values.ports.grpc }}
          service: ""
        {{- toYaml .Values.probes.startup | nindent 8 }}
      readinessProbe:
        grpc:
          port: {{ .Values.ports.grpc }}
          service: idemd.v1.Idempotency
        {{- toYaml .Values.probes.readiness | nindent 8 }}
      livenessProbe:
        grpc:
          port: {{ .Values.ports.grpc }}
          service: ""
        {{- toYaml .Values.probes.liveness | nindent 8 }}
      {{- end }}
      {{- if gt (int .Values.lifecycle.preStopSleepSeconds) 0 }}
      lifecycle:
        preStop:
          sleep:
            seconds: {{ int .Values.lifecycle.preStopSleepSeconds }}
      {{- end }}
      resources:
        {{- toYaml .Values.resources | nindent 8 }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      volumeMounts:
        - name: config
          mountPath: /etc/idemd/config
          readOnly: true
        - name: tmp
          mountPath: /tmp
        {{- if .Values.auth.existingSecret }}
        - name: auth-tokens
          mountPath: /etc/idemd/auth
          readOnly: true
        {{- end }}
        {{- if .Values.tls.existingSecret }}
        - name: tls
          mountPath: /etc/idemd/tls
          readOnly: true
        {{- end }}
        {{- if .Values.tls.clientCA.existingSecret }}
        - name: tls-client-ca
          mountPath: /etc/idemd/tls-client-ca
          readOnly: true
        {{- end }}
        {{- if or .Values.tls.clientTenants.existingConfigMap .Values.tls.clientTenants.existingSecret }}
        - name: tls-client-tenants
          mountPath: /etc/idemd/tls-client-tenants
          readOnly: true
        {{- end }}
        {{- if .Values.encryption.existingSecret }}
        - name: encryption-keys
          mountPath: /etc/idemd/encryption
          readOnly: true
        {{- end }}
        {{- if eq .Values.store "embedded" }}
        - name: data
          mountPath: /var/lib/idemd
        {{- else if .Values.cql.tls.enabled }}
        {{- include "idemd.cqlTlsVolumeMount" . | nindent 8 }}
        {{- end }}
    {{- with .Values.extraContainers }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  volumes:
    - name: config
      configMap:
        name: {{ include "idemd.fullname" . }}
    - name: tmp
      emptyDir:
        sizeLimit: 64Mi
    {{- with .Values.auth.existingSecret }}
    - name: auth-tokens
      secret:
        secretName: {{ . | quote }}
        items:
          - key: {{ $.Values.auth.key | quote }}
            path: {{ $.Values.auth.key | quote }}
    {{- end }}
    {{- with .Values.tls.existingSecret }}
    - name: tls
      secret:
        secretName: {{ . | quote }}
        items:
          - key: tls.crt
            path: tls.crt
          - key: tls.key
            path: tls.key
    {{- end }}
    {{- with .Values.tls.clientCA.existingSecret }}
    - name: tls-client-ca
      secret:
        secretName: {{ . | quote }}
        items:
          - key: {{ $.Values.tls.clientCA.key | quote }}
            path: {{ $.Values.tls.clientCA.key | quote }}
    {{- end }}
    {{- with .Values.tls.clientTenants.existingConfigMap }}
    - name: tls-client-tenants
      configMap:
        name: {{ . | quote }}
        items:
          - key: {{ $.Values.tls.clientTenants.key | quote }}
            path: {{ $.Values.tls.clientTenants.key | quote }}
    {{- end }}
    {{- with .Values.tls.clientTenants.existingSecret }}
    - name: tls-client-tenants
      secret:
        secretName: {{ . | quote }}
        items:
          - key: {{ $.Values.tls.clientTenants.key | quote }}
            path: {{ $.Values.tls.clientTenants.key | quote }}
    {{- end }}
    {{- with .Values.encryption.existingSecret }}
    - name: encryption-keys
      secret:
        secretName: {{ . | quote }}
        # Owner root, readable through fsGroup only: never world-readable
        # (idemd warns about a world-readable keyring).
        defaultMode: 0440
        items:
          - key: {{ $.Values.encryption.key | quote }}
            path: {{ $.Values.encryption.key | quote }}
    {{- end }}
    {{- if and (ne .Values.store "embedded") .Values.cql.tls.enabled }}
    {{- include "idemd.cqlTlsVolume" . | nindent 4 }}
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if and (ne .Values.store "embedded") .Values.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- range .Values.topologySpreadConstraints }}
    {{- $c := deepCopy . }}
    {{- if not (hasKey $c "labelSelector") }}
    {{- $_ := set $c "labelSelector" (dict "matchLabels" (include "idemd.serverSelectorLabels" $ | fromYaml)) }}
    {{- if not (hasKey $c "matchLabelKeys") }}
    {{- $_ := set $c "matchLabelKeys" (list "pod-template-hash") }}
    {{- end }}
    {{- end }}
    - {{ toYaml $c | indent 6 | trim }}
    {{- end }}
  {{- end }}
{{- end }}
