{{/* Names, labels and the settings -> LAZARUS_* mapping shared by the templates. */}}

{{- define "lazarus.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "lazarus.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A component's name: <fullname>-<component>, at most 52 characters (room for pod suffixes). */}}
{{- define "lazarus.componentName" -}}
{{- printf "%s-%s" (include "lazarus.fullname" .root) .component | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{- define "lazarus.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "lazarus.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lazarus.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "lazarus.labels" -}}
helm.sh/chart: {{ include "lazarus.chart" .root }}
{{ include "lazarus.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: lazarus
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "lazarus.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "lazarus.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "lazarus.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
A setting's value as the CLI reads it: whole floats without an exponent
(JSON numbers reach templates as float64), booleans as true/false.
*/}}
{{- define "lazarus.settingValue" -}}
{{- if kindIs "float64" . -}}
{{- if eq . (floor .) -}}{{- int64 . -}}{{- else -}}{{- . -}}{{- end -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{/* ConfigMap data lines LAZARUS_<KEY>: "<value>" from a settings map (keys camelCase). */}}
{{- define "lazarus.settingsData" -}}
{{- range $key, $value := . }}
LAZARUS_{{ $key | snakecase | upper }}: {{ include "lazarus.settingValue" $value | quote }}
{{- end }}
{{- end -}}

{{/* host:port of etcd. */}}
{{- define "lazarus.etcdEndpoint" -}}
{{- if .Values.etcd.enabled -}}
{{- printf "%s:2379" (include "lazarus.componentName" (dict "root" . "component" "etcd")) -}}
{{- else -}}
{{- required "externalEtcd.endpoint is required when etcd.enabled is false" .Values.externalEtcd.endpoint -}}
{{- end -}}
{{- end -}}

{{/* The Redis URL of the node agents. */}}
{{- define "lazarus.redisUrl" -}}
{{- if .Values.redis.enabled -}}
{{- printf "redis://%s:6379/0" (include "lazarus.componentName" (dict "root" . "component" "redis")) -}}
{{- else -}}
{{- required "externalRedis.url is required when redis.enabled is false" .Values.externalRedis.url -}}
{{- end -}}
{{- end -}}

{{/* True ("true") when the coordinators talk TLS to an external etcd. */}}
{{- define "lazarus.etcdTls" -}}
{{- if and (not .Values.etcd.enabled) .Values.externalEtcd.tls.enabled -}}true{{- end -}}
{{- end -}}

{{- define "lazarus.etcdAuth" -}}
{{- if and (not .Values.etcd.enabled) .Values.externalEtcd.auth.enabled -}}true{{- end -}}
{{- end -}}

{{- define "lazarus.redisTls" -}}
{{- if and (not .Values.redis.enabled) .Values.externalRedis.tls.enabled -}}true{{- end -}}
{{- end -}}

{{- define "lazarus.redisAuth" -}}
{{- if or .Values.redis.enabled .Values.externalRedis.auth.enabled -}}true{{- end -}}
{{- end -}}

{{- define "lazarus.etcdTlsDir" -}}/etc/lazarus/etcd-tls{{- end -}}
{{- define "lazarus.redisTlsDir" -}}/etc/lazarus/redis-tls{{- end -}}

{{/* The coordinators' gRPC Service address, host:port. */}}
{{- define "lazarus.coordinatorAddress" -}}
{{- printf "%s.%s.svc:%d" (include "lazarus.componentName" (dict "root" . "component" "coordinator")) .Release.Namespace (int .Values.coordinator.grpcPort) -}}
{{- end -}}

{{/* The coordinators' headless Service address (every replica's record), host:port. */}}
{{- define "lazarus.coordinatorHeadlessAddress" -}}
{{- printf "%s-headless.%s.svc:%d" (include "lazarus.componentName" (dict "root" . "component" "coordinator")) .Release.Namespace (int .Values.coordinator.grpcPort) -}}
{{- end -}}

{{/* Redis AUTH: always for the in-chart Redis (a generated password), or as externalRedis.auth says. */}}
{{- define "lazarus.redisPasswordSecret" -}}
{{- if .Values.redis.enabled -}}
{{- default (printf "%s-auth" (include "lazarus.componentName" (dict "root" . "component" "redis"))) .Values.redis.auth.existingSecret -}}
{{- else -}}
{{- required "externalRedis.auth.existingSecret is required with externalRedis.auth.enabled" .Values.externalRedis.auth.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "lazarus.redisPasswordKey" -}}
{{- if .Values.redis.enabled -}}password{{- else -}}{{ .Values.externalRedis.auth.passwordKey }}{{- end -}}
{{- end -}}

{{/*
TLS of the gRPC surfaces: "true" when on. Fails, saying what to set, when TLS
is on and no certificate source is configured.
*/}}
{{- define "lazarus.tls" -}}
{{- $t := .Values.tls -}}
{{- if $t.enabled -}}
{{- if not (or $t.certManager.enabled (and $t.existingSecrets.coordinator $t.existingSecrets.nodeAgent)) -}}
{{- fail "\n\nTLS and mutual TLS are on by default and need certificates. Set one of:\n  --set tls.certManager.enabled=true   (cert-manager and its csi-driver issue them)\n  --set tls.existingSecrets.coordinator=<secret> --set tls.existingSecrets.nodeAgent=<secret>   (made with `lazarus certs`, see docs/security.md)\nor, for a throwaway evaluation without TLS or authentication:\n  --set tls.enabled=false   (LAZARUS_AUTH=none: anyone who reaches port 7070 may act as any node or operator)\n" -}}
{{- end -}}
{{- if and $t.certManager.enabled (ne .Values.nodeAgent.nodeIdFieldPath "metadata.name") -}}
{{- fail "tls.certManager.enabled issues node certificates per pod name: set nodeAgent.nodeIdFieldPath=metadata.name, or use tls.existingSecrets" -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{- define "lazarus.tlsDir" -}}/etc/lazarus/tls{{- end -}}

{{/* The name verified in coordinators' certificates. */}}
{{- define "lazarus.tlsServerName" -}}
{{- default (printf "%s.%s.svc" (include "lazarus.componentName" (dict "root" . "component" "coordinator")) .Release.Namespace) .Values.tls.serverName -}}
{{- end -}}

{{/* The issuer signing the cluster's certificates (cert-manager). */}}
{{- define "lazarus.issuerName" -}}
{{- default (printf "%s-ca" (include "lazarus.fullname" .)) .Values.tls.certManager.issuerRef.name -}}
{{- end -}}

{{- define "lazarus.issuerKind" -}}
{{- if .Values.tls.certManager.issuerRef.name -}}{{ .Values.tls.certManager.issuerRef.kind }}{{- else -}}Issuer{{- end -}}
{{- end -}}
