{{/*
RBAC rules, derived from the API calls in operator/chattts_operator (each rule names its
callers). Verbs: kopf watches need list+watch; server-side apply needs patch, and create
when the object does not exist yet; kopf keeps its progress annotations and finalizers with
patch. Children are removed by the garbage collector (owner references), so no delete,
except the NetworkPolicy, which the operator removes itself when spec.networkPolicy goes, and
old runtime ConfigMaps, once no revision of the Deployment mounts them.
tests/helm/test_rbac_cluster.py runs the operator under exactly these rules.
*/}}

{{/* Rules on cluster-scoped objects (and the cross-namespace reads of GPUSharePolicy passes). */}}
{{- define "chattts-operator.clusterRules" -}}
# kopf: discovers its resources and notices CRDs installed or upgraded after it started.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
# sharepolicy/controller.py: one daemon per policy (kopf keeps a finalizer and annotations on it).
- apiGroups: ["tts.chattts.io"]
  resources: ["gpusharepolicies"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["tts.chattts.io"]
  resources: ["gpusharepolicies/status"]
  verbs: ["patch"]
# core/kube.py NodeGpuCache (largest GPU, by label) and sharepolicy/controller.py (pool nodes, node watch).
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch"]
# sharepolicy/controller.py ensure_priority_classes: creates chattts-online/-offline if absent,
# reads them back otherwise. create cannot be limited to names; get is.
- apiGroups: ["scheduling.k8s.io"]
  resources: ["priorityclasses"]
  verbs: ["create"]
- apiGroups: ["scheduling.k8s.io"]
  resources: ["priorityclasses"]
  resourceNames: ["chattts-online", "chattts-offline"]
  verbs: ["get"]
{{- if .Values.watchNamespaces }}
# kopf: with a namespace list it follows which of them exist.
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
{{- end }}

{{/* Rules inside the watched namespaces (every namespace when watchNamespaces is empty). */}}
{{- define "chattts-operator.namespacedRules" -}}
# deployment/controller.py: list+watch, and one get when a child vanished (does its owner still
# exist?), kopf annotations/finalizer;
# sharepolicy/controller.py: replica-cap annotations on member ChatTTSDeployments.
- apiGroups: ["tts.chattts.io"]
  resources: ["chattsdeployments"]
  verbs: ["get", "list", "watch", "patch"]
# deployment/controller.py and autoscaling/controller.py write status.
- apiGroups: ["tts.chattts.io"]
  resources: ["chattsdeployments/status"]
  verbs: ["patch"]
# autoscaling/controller.py: spec.replicas through the scale subresource.
- apiGroups: ["tts.chattts.io"]
  resources: ["chattsdeployments/scale"]
  verbs: ["patch"]
# Children carry blockOwnerDeletion owner references: clusters with the
# OwnerReferencesPermissionEnforcement admission plugin require this.
- apiGroups: ["tts.chattts.io"]
  resources: ["chattsdeployments/finalizers"]
  verbs: ["update"]
# deployment/controller.py: server-side apply of the children, read from a label-selected
# list+watch cache (core/watch.py ChildCache; get only while a watch has never listed).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch"]
# The runtime ConfigMap is content-addressed (<name>-runtime-<hash>): a config change is a new
# one, and the operator deletes those of its own that no ReplicaSet of the Deployment mounts any more.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
# deployment/controller.py: which runtime ConfigMaps the Deployment's revisions still mount
# (the ChildCache's label-selected watch; never written).
- apiGroups: ["apps"]
  resources: ["replicasets"]
  verbs: ["list", "watch"]
# deployment/controller.py: the NetworkPolicy child (spec.networkPolicy), server-side applied like
# the others, and deleted when the section is removed or disabled (its owner still lives).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- if .Values.rbac.apiKeySecretCheck }}
# deployment/controller.py: whether spec.auth's Secret exists (a metadata-only get; no list/watch).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
# deployment/controller.py, dra profile: the ResourceClaimTemplate child, server-side applied,
# listed and deleted once a rollout no longer uses it (a template's spec cannot change).
- apiGroups: ["resource.k8s.io"]
  resources: ["resourceclaimtemplates"]
  verbs: ["get", "list", "create", "patch", "delete"]
# deployment/controller.py (status: what was allocated) and sharepolicy/controller.py (members'
# allocated memory) read the claims Kubernetes makes from the templates; never write them.
- apiGroups: ["resource.k8s.io"]
  resources: ["resourceclaims"]
  verbs: ["list"]
# autoscaling/controller.py (Ready pods to scrape), sharepolicy/controller.py (members' pods) and
# deployment/controller.py (the serving pods' reasons in status and the dra profile's scheduler
# reason, from the ChildCache's watch).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
# deployment/controller.py: the AWQ quantization Job is created once and Jobs of an older spec deleted;
# sharepolicy/controller.py: offline members are watched, listed and suspended/resumed.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# Every controller posts Events (core/kube.py post_event); kopf too.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
