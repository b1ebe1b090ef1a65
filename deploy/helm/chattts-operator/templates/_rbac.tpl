{{/*
Rules on cluster-scoped objects. Every rule names the call sites in the operator that need it.
*/}}
{{- define "chattts-operator.clusterRules" -}}
# kopf: discovers its resources and notices CRDs installed or upgraded after it started.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
{{- if .Values.watchNamespaces }}
# kopf: with a namespace list it follows which of them exist.
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get", "list", "watch"]
{{- end }}
{{- end }}

{{/*
Rules inside the watched namespaces.
*/}}
{{- define "chattts-operator.namespacedRules" -}}
- apiGroups: ["tts.chattts.io"]
  resources: ["chattsdeployments"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["tts.chattts.io"]
  resources: ["chattsdeployments/status"]
  verbs: ["get", "patch"]
# kopf posts Events about handler progress and failures.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
