"""Pure builders: a ChatTTSDeployment's spec -> the child objects, as plain dicts.

No I/O here. Names are deterministic (the same spec always gives the same objects), every
child has an owner reference to the ChatTTSDeployment (deleting it collects them) and the
``app.kubernetes.io`` labels. Each child carries ``chattts.io/intent-hash``, a hash of the
manifest itself: the reconciler compares it with the live object's to know whether the
intent changed (removals included), and compares fields to catch hand edits.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from chattts_runtime.config import (
    CONFIG_PATH,
    EngineKind,
    EngineSettings,
    ModelSettings,
    RuntimeConfig,
    ServerSettings,
    TextSettings,
)

from chattts_operator.api.access import PeerSpec
from chattts_operator.api.chattts import API_VERSION, KIND, ChatTTSDeploymentSpec
from chattts_operator.core.labels import (
    CONFIG_HASH_ANNOTATION,
    INTENT_HASH_ANNOTATION,
    child_labels,
    selector_labels,
)
from chattts_operator.core.settings import OperatorSettings
from chattts_operator.deployment.gpu import DraRequest, GpuAssignment, node_affinity

MODEL_MOUNT_PATH = "/models/chattts"
CONFIG_DIR = CONFIG_PATH.rsplit("/", 1)[0]
CONFIG_KEY = CONFIG_PATH.rsplit("/", 1)[1]
HTTP_PORT = 8000
SERVICE_METRICS_PORT = 9090
RUNTIME_USER = 65532
CONTAINER_NAME = "runtime"
# The endpoints controller needs a moment to take a terminating pod out of the Service
# before the runtime stops accepting requests.
PRE_STOP_SLEEP_SECONDS = 5
SCRATCH_SIZE = "2Gi"
# Not under CONFIG_DIR: a mount point inside the read-only ConfigMap volume cannot be made.
API_KEYS_MOUNT_PATH = "/etc/chattts-api-keys"
API_KEYS_FILE_MODE = 0o444  # the runtime runs as RUNTIME_USER, not the files' owner
DRA_POD_CLAIM = "gpu"  # the pod's name for its claim (pod.spec.resourceClaims, container resources.claims)

def event_subject(body: dict[str, Any]) -> dict[str, Any]:
    """The ChatTTSDeployment as an Event's involved object (for ``Kube.post_event``)."""
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": body["metadata"]}


def deployment_name(name: str) -> str:
    return name


def service_name(name: str) -> str:
    return name


RUNTIME_CONFIGMAP_INFIX = "-runtime"
CONFIG_HASH_LENGTH = 16
CONFIG_VOLUME = "config"


def configmap_name(name: str, config_hash_value: str) -> str:
    """Content-addressed: the name carries the hash of the config it holds, so a new config is
    a new ConfigMap that the Deployment's pod template names. The ConfigMap and the Deployment
    can then be applied at the same time: a pod that starts before its ConfigMap exists waits
    for its volume, it never runs with another config."""
    return f"{name}{RUNTIME_CONFIGMAP_INFIX}-{config_hash_value}"


def is_runtime_configmap_name(owner_name: str, name: str) -> bool:
    """One of ``owner_name``'s runtime ConfigMaps, hashed or of the layout before (``<name>-runtime``)."""
    prefix = f"{owner_name}{RUNTIME_CONFIGMAP_INFIX}"
    return name == prefix or (name.startswith(prefix + "-") and len(name) == len(prefix) + 1 + CONFIG_HASH_LENGTH)


def pdb_name(name: str) -> str:
    return name


def network_policy_name(name: str) -> str:
    return name


def resource_claim_template_name(name: str, dra: DraRequest) -> str:
    """A template's spec cannot change: a new request gets a new name (the pods roll to it)."""
    return f"{name}-gpu-{stable_hash(dra.claim_spec(), 8)}"


@dataclass(frozen=True)
class Owner:
    """What the builders need to know about the ChatTTSDeployment itself."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def stable_hash(value: Any, length: int = 16) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:length]


def with_intent_hash(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest with ``chattts.io/intent-hash`` set to the hash of everything else."""
    annotations = manifest["metadata"].setdefault("annotations", {})
    annotations.pop(INTENT_HASH_ANNOTATION, None)
    annotations[INTENT_HASH_ANNOTATION] = stable_hash(manifest)
    return manifest


def _metadata(owner: Owner, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": child_labels(owner.name),
        "ownerReferences": [owner.reference()],
    }


# --- ConfigMap -------------------------------------------------------------------------


# spec.speech.voiceFromFirstPiece -> the runtime's text.voice_from_first_piece.
VOICE_FROM_FIRST_PIECE = {"upstream": True, "stream": "stream", "off": False}


def runtime_config(spec: ChatTTSDeploymentSpec) -> RuntimeConfig:
    """The runtime's config (chattts_runtime.config), rendered from the spec."""
    engine = spec.engine
    return RuntimeConfig(
        text=TextSettings(voice_from_first_piece=VOICE_FROM_FIRST_PIECE[spec.speech.voice_from_first_piece]),
        model=ModelSettings(path=MODEL_MOUNT_PATH, format=spec.model.format, served_name=spec.model.served_name),
        engine_kind=EngineKind(engine.kind),
        # Every engine field of the CRD is the runtime's field of the same name (EngineSettings
        # forbids unknown ones: a CRD field the runtime lacks fails here, not silently).
        engine=EngineSettings(**engine.model_dump(exclude={"kind"}), tensor_parallel_size=spec.gpu.count),
        server=ServerSettings(
            host="0.0.0.0",
            port=HTTP_PORT,
            max_queue=spec.server.max_queue,
            max_input_chars=spec.server.max_input_chars,
            shutdown_grace_seconds=float(spec.server.shutdown_grace_seconds),
            # Only the path: the keys stay in the Secret volume, never in the ConfigMap.
            api_keys_path=API_KEYS_MOUNT_PATH if spec.auth is not None else None,
        ),
        device="cuda",
    )


def config_hash(data: dict[str, str]) -> str:
    """The hash of a runtime ConfigMap's data: its name's suffix and the pod template's annotation."""
    return stable_hash(data, CONFIG_HASH_LENGTH)


def build_configmap(owner: Owner, spec: ChatTTSDeploymentSpec) -> dict[str, Any]:
    """The runtime config, immutable: its name changes with its content (``configmap_name``), so
    the data of a name never changes (and the kubelets need not watch it)."""
    data = {CONFIG_KEY: runtime_config(spec).to_yaml()}
    return with_intent_hash({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(owner, configmap_name(owner.name, config_hash(data))),
        "immutable": True,
        "data": data,
    })


def mounted_configmap(workload: dict[str, Any]) -> str | None:
    """The runtime ConfigMap a Deployment's or ReplicaSet's pod template mounts."""
    volumes = (((workload.get("spec") or {}).get("template") or {}).get("spec") or {}).get("volumes") or []
    for volume in volumes:
        if volume.get("name") == CONFIG_VOLUME:
            return (volume.get("configMap") or {}).get("name")
    return None


def replicaset_revision(replicaset: dict[str, Any]) -> dict[str, Any]:
    """What the operator needs of a ReplicaSet (its metadata: owner, labels; the runtime
    ConfigMap its template mounts), without the rest of its pod template: the watch cache holds
    up to ``revisionHistoryLimit`` + 1 of them per object, and whole they were +20-25 MiB at 1,000."""
    volumes = (((replicaset.get("spec") or {}).get("template") or {}).get("spec") or {}).get("volumes") or []
    config = [volume for volume in volumes if volume.get("name") == CONFIG_VOLUME]
    return {"apiVersion": replicaset.get("apiVersion"), "kind": replicaset.get("kind"),
            "metadata": replicaset.get("metadata") or {}, "spec": {"template": {"spec": {"volumes": config}}}}


# --- Deployment ------------------------------------------------------------------------


def _model_volume(spec: ChatTTSDeploymentSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """The weights' volume and mount: read-only on both sides, whatever the source."""
    model = spec.model
    mount: dict[str, Any] = {"name": "model", "mountPath": MODEL_MOUNT_PATH, "readOnly": True}
    if model.pvc is not None:
        volume = {"name": "model", "persistentVolumeClaim": {"claimName": model.pvc.claim_name, "readOnly": True}}
        if model.pvc.sub_path:
            mount["subPath"] = model.pvc.sub_path
    elif model.host_path is not None:
        volume = {"name": "model", "hostPath": {"path": model.host_path.path, "type": "Directory"}}
    else:
        assert model.image is not None  # the model validator guarantees one source
        volume = {"name": "model", "image": {"reference": model.image.reference, "pullPolicy": model.image.pull_policy}}
    return volume, mount


def _api_keys_volume(spec: ChatTTSDeploymentSpec) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The API keys' Secret volume and its read-only mount, when spec.auth is set."""
    if spec.auth is None:
        return None
    secret: dict[str, Any] = {"secretName": spec.auth.secret_name, "defaultMode": API_KEYS_FILE_MODE}
    if spec.auth.keys:
        secret["items"] = [{"key": key, "path": key} for key in spec.auth.keys]
    return ({"name": "api-keys", "secret": secret},
            {"name": "api-keys", "mountPath": API_KEYS_MOUNT_PATH, "readOnly": True})


def _probe(path: str, period: int, failures: int, timeout: int = 3) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http", "scheme": "HTTP"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
        "successThreshold": 1,
    }


def build_deployment(
    owner: Owner,
    spec: ChatTTSDeploymentSpec,
    gpu: GpuAssignment,
    settings: OperatorSettings,
    *,
    config_hash_value: str,
    replicas: int,
    pool_requirements: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``pool_requirements``: a GPUSharePolicy's pool as node-affinity requirements, ANDed into
    every term (the pods run only where their share is counted)."""
    model_volume, model_mount = _model_volume(spec)
    volumes: list[dict[str, Any]] = [
        {
            "name": CONFIG_VOLUME,
            "configMap": {"name": configmap_name(owner.name, config_hash_value),
                          "items": [{"key": CONFIG_KEY, "path": CONFIG_KEY}]},
        },
        model_volume,
        # The only writable path: caches (HF, vLLM, Triton, inductor) live under /tmp.
        {"name": "scratch", "emptyDir": {"sizeLimit": SCRATCH_SIZE}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True},
        model_mount,
        {"name": "scratch", "mountPath": "/tmp"},
    ]
    api_keys = _api_keys_volume(spec)
    if api_keys is not None:
        volumes.append(api_keys[0])
        mounts.append(api_keys[1])
    if spec.gpu.count > 1:
        # NCCL between tensor-parallel ranks needs more shared memory than the runtime's 64 MiB default.
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})

    limits = {"memory": spec.resources.memory, **gpu.limits}
    resources: dict[str, Any] = {"requests": {"cpu": spec.resources.cpu, "memory": spec.resources.memory},
                                 "limits": limits}
    if gpu.dra is not None:
        resources["claims"] = [{"name": DRA_POD_CLAIM}]
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image or settings.runtime_image,
        "imagePullPolicy": settings.runtime_image_pull_policy,
        "args": ["serve", "--config", CONFIG_PATH],
        "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}],
        "resources": resources,
        # Loading weights and capturing CUDA graphs can take minutes: the startup probe allows 15.
        "startupProbe": _probe("/health", period=10, failures=90),
        "livenessProbe": _probe("/health", period=10, failures=3, timeout=5),
        "readinessProbe": _probe("/ready", period=5, failures=2),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SLEEP_SECONDS}}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
    }
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        # In-flight speech may finish: the runtime's own grace, the preStop pause, and a margin.
        "terminationGracePeriodSeconds": spec.server.shutdown_grace_seconds + PRE_STOP_SLEEP_SECONDS + 10,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUNTIME_USER,
            "runAsGroup": RUNTIME_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if gpu.dra is not None:
        pod_spec["resourceClaims"] = [{"name": DRA_POD_CLAIM,
                                       "resourceClaimTemplateName": resource_claim_template_name(owner.name, gpu.dra)}]
    affinity = node_affinity(gpu, settings)
    if pool_requirements:
        terms = (affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
                 if affinity else [{"matchExpressions": []}])
        affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {**term, "matchExpressions": [*term.get("matchExpressions", []), *pool_requirements]} for term in terms]}}}
    if affinity:
        pod_spec["affinity"] = affinity
    if gpu.node_selector:
        pod_spec["nodeSelector"] = dict(sorted(gpu.node_selector.items()))
    tolerations = []
    if settings.gpu_toleration_key:
        tolerations.append({"key": settings.gpu_toleration_key, "operator": "Exists", "effect": "NoSchedule"})
    tolerations += [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if spec.priority_class_name:
        pod_spec["priorityClassName"] = spec.priority_class_name

    return with_intent_hash({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner, deployment_name(owner.name)),
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 5,
            "progressDeadlineSeconds": 1200,
            "selector": {"matchLabels": selector_labels(owner.name)},
            # Never below the serving capacity during a rollout: one new pod at a time.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {
                    "labels": child_labels(owner.name),
                    # Says which config the pods run (the ConfigMap's name carries it too).
                    "annotations": {CONFIG_HASH_ANNOTATION: config_hash_value},
                },
                "spec": pod_spec,
            },
        },
    })


# --- ResourceClaimTemplate (dra profile) ---------------------------------------------------


def build_resource_claim_template(owner: Owner, dra: DraRequest, *, purpose: str = "",
                                  labels: dict[str, str] | None = None) -> dict[str, Any]:
    """One claim per pod, made by Kubernetes from this template; the claims carry the
    template's labels (by default the serving pods'), so the reconciler and the share policy
    list them with the pods' selector. ``purpose`` and ``labels``: another user's template
    (the quantization Job's), apart from the serving pods'."""
    metadata = _metadata(owner, resource_claim_template_name(owner.name + (f"-{purpose}" if purpose else ""), dra))
    if labels is not None:
        metadata["labels"] = dict(labels)
    return with_intent_hash({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": metadata,
        "spec": {"metadata": {"labels": dict(metadata["labels"])}, "spec": dra.claim_spec()},
    })


# --- Service and PodDisruptionBudget -----------------------------------------------------


def build_service(owner: Owner) -> dict[str, Any]:
    return with_intent_hash({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner, service_name(owner.name)),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner.name),
            "ports": [
                {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                # The runtime serves /metrics on its HTTP port; a port named "metrics" lets
                # ServiceMonitors select it by name.
                {"name": "metrics", "port": SERVICE_METRICS_PORT, "targetPort": "http", "protocol": "TCP"},
            ],
        },
    })


def build_pdb(owner: Owner) -> dict[str, Any]:
    return with_intent_hash({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(owner, pdb_name(owner.name)),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(owner.name)},
            # A pod that never became ready must not block a node drain.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    })


# --- NetworkPolicy ---------------------------------------------------------------------------


def _peer(peer: PeerSpec) -> dict[str, Any]:
    return peer.model_dump(by_alias=True, exclude_none=True)


def build_network_policy(owner: Owner, spec: ChatTTSDeploymentSpec) -> dict[str, Any] | None:
    """Ingress to the serving pods' HTTP port from spec.networkPolicy's peers only; None when
    the section is unset or disabled (the reconciler then deletes a policy it made before)."""
    policy = spec.network_policy
    if policy is None or not policy.enabled:
        return None
    port = [{"protocol": "TCP", "port": HTTP_PORT}]
    clients = [_peer(p) for p in policy.allow_from] or [{"podSelector": {}}]  # default: this namespace
    ingress = [{"from": clients, "ports": port}]
    if policy.metrics_from:
        # /metrics is served on the same port: the scrapers get a rule of their own.
        ingress.append({"from": [_peer(p) for p in policy.metrics_from], "ports": port})
    return with_intent_hash({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(owner, network_policy_name(owner.name)),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(owner.name)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    })
