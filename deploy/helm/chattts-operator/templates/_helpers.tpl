{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "chattts-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the operator's objects: the release name when it already contains the chart name. */}}
{{- define "chattts-operator.fullname" -}}
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

{{- define "chattts-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object of the release. */}}
{{- define "chattts-operator.labels" -}}
helm.sh/chart: {{ include "chattts-operator.chart" . }}
{{ include "chattts-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: chattts
{{- end }}

{{/* Labels that select the operator pod; immutable once the Deployment exists. */}}
{{- define "chattts-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "chattts-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "chattts-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "chattts-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository[:tag][@digest] of an image block; the tag defaults to the chart's appVersion. */}}
{{- define "chattts-operator.imageRef" -}}
{{- $image := index . 0 }}{{- $root := index . 1 }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{/* The watched namespaces, de-duplicated; empty means cluster-wide. */}}
{{- define "chattts-operator.watchNamespaces" -}}
{{- .Values.watchNamespaces | uniq | sortAlpha | join "," }}
{{- end }}

{{/* CRDs are shared by every release: no instance label, only what identifies the chart. */}}
{{- define "chattts-operator.crdLabels" -}}
helm.sh/chart: {{ include "chattts-operator.chart" . }}
app.kubernetes.io/part-of: chattts
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Operator command-line arguments (after the `chattts-operator` entrypoint). */}}
{{- define "chattts-operator.args" -}}
- run
- --liveness=http://0.0.0.0:{{ .Values.operator.healthPort }}/healthz
{{- if .Values.watchNamespaces }}
{{- range (.Values.watchNamespaces | uniq | sortAlpha) }}
- --namespace={{ . }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
{{- if eq .Values.operator.logLevel "debug" }}
- --debug
{{- else if eq .Values.operator.logLevel "info" }}
- --verbose
{{- end }}
{{- range .Values.operator.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* Settings the operator reads from its environment (chattts_operator/settings.py:
CHATTTS_OPERATOR_<FIELD>). The operator refuses unknown CHATTTS_OPERATOR_* variables, so only
its own fields are set here. */}}
{{- define "chattts-operator.env" -}}
- name: CHATTTS_OPERATOR_WATCH_NAMESPACES
  value: {{ include "chattts-operator.watchNamespaces" . | quote }}
- name: CHATTTS_OPERATOR_HEALTH_PORT
  value: {{ .Values.operator.healthPort | quote }}
- name: CHATTTS_OPERATOR_METRICS_PORT
  value: {{ .Values.metrics.port | quote }}
- name: CHATTTS_OPERATOR_API_KEY_SECRET_CHECK
  value: {{ .Values.rbac.apiKeySecretCheck | quote }}
- name: CHATTTS_OPERATOR_RESYNC_INTERVAL_SECONDS
  value: {{ .Values.operator.resyncIntervalSeconds | quote }}
- name: CHATTTS_OPERATOR_RUNTIME_IMAGE
  value: {{ include "chattts-operator.imageRef" (list .Values.runtime.image .) | quote }}
- name: CHATTTS_OPERATOR_RUNTIME_IMAGE_PULL_POLICY
  value: {{ .Values.runtime.image.pullPolicy | quote }}
- name: CHATTTS_OPERATOR_GPU_PROFILE
  value: {{ .Values.gpu.sharingProfile | quote }}
- name: CHATTTS_OPERATOR_GPU_MEMORY_RESOURCE
  value: {{ .Values.gpu.resourceNames.gpuMemory | quote }}
- name: CHATTTS_OPERATOR_GPU_RESOURCE
  value: {{ .Values.gpu.resourceNames.gpu | quote }}
- name: CHATTTS_OPERATOR_HAMI_MEMORY_RESOURCE
  value: {{ .Values.gpu.resourceNames.hamiMemory | quote }}
- name: CHATTTS_OPERATOR_MIG_RESOURCE_PREFIX
  value: {{ .Values.gpu.resourceNames.migPrefix | quote }}
{{- with .Values.gpu.migProfiles }}
- name: CHATTTS_OPERATOR_MIG_PROFILES
  value: {{ join "," . | quote }}
{{- end }}
- name: CHATTTS_OPERATOR_DRA_DEVICE_CLASS
  value: {{ .Values.gpu.dra.deviceClass | quote }}
- name: CHATTTS_OPERATOR_DRA_DRIVER
  value: {{ .Values.gpu.dra.driver | quote }}
- name: CHATTTS_OPERATOR_DRA_CONSUMABLE_CAPACITY
  value: {{ .Values.gpu.dra.consumableCapacity | quote }}
- name: CHATTTS_OPERATOR_NODE_MEMORY_LABEL
  value: {{ .Values.gpu.nodeMemoryLabel | quote }}
- name: CHATTTS_OPERATOR_NODE_PRODUCT_LABEL
  value: {{ .Values.gpu.nodeProductLabel | quote }}
- name: CHATTTS_OPERATOR_GPU_TOLERATION_KEY
  value: {{ .Values.gpu.tolerationKey | quote }}
- name: CHATTTS_AUTOSCALER_INTERVAL_SECONDS
  value: {{ .Values.autoscaler.intervalSeconds | quote }}
{{- end }}
