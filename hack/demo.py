#!/usr/bin/env python3
"""The one-command demo: a local Kubernetes control plane with simulated GPU nodes, the
Helm chart installed, the real operator reconciling the sample ChatTTSDeployments.

    hack/demo.sh        (make demo)        bring everything up; safe to run again
    hack/demo-down.sh   (make demo-down)   stop the operator and the cluster

What runs where:
- etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok run as local
  processes (hack/cluster/localcluster.py). kwok plays the kubelet of the GPU nodes in
  hack/cluster/nodes.yaml: pods are scheduled for real and marked Running, no container runs.
- `helm upgrade --install` installs the chart: CRDs, RBAC, the operator Deployment. Its pod
  is simulated by kwok like every other pod.
- So the reconciling is real, the operator itself runs here as a background process
  (`chattts-operator run`), authenticated as the chart's ServiceAccount (a TokenRequest
  token): it has exactly the permissions the chart grants. Its pid file and log are in the
  cluster's folder.

Environment: CHATTTS_DEMO_CLUSTER (default "demo"), CHATTTS_CLUSTER_HOME,
CHATTTS_CLUSTER_BIN_DIR (use prebuilt binaries), CHATTTS_DEMO_TIMEOUT (seconds, default 300).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack" / "cluster"))

CHART = REPO / "deploy" / "helm" / "chattts-operator"
EXAMPLES = REPO / "deploy" / "examples"
CLUSTER_NAME = os.environ.get("CHATTTS_DEMO_CLUSTER", "demo")
RELEASE = "chattts-operator"
OPERATOR_NAMESPACE = "chattts-system"
DEMO_NAMESPACE = "chattts-demo"
TIMEOUT = float(os.environ.get("CHATTTS_DEMO_TIMEOUT", "300"))
MANAGED_SELECTOR = "app.kubernetes.io/managed-by=chattts-operator,app.kubernetes.io/component=tts-server"
MODEL_MOUNT = "/models/chattts"
GPU_RESOURCE_PREFIXES = ("nvidia.com/", "volcano.sh/")
TOKEN_DURATION = "24h"

# The simulated nodes (hack/cluster/nodes.yaml) are H200s partitioned 3g.71gb + 2g.35gb + 2 x 1g.18gb.
DEMO_VALUES = {
    "gpu": {"migProfiles": ["1g.18gb", "2g.35gb", "3g.71gb"]},
    "dashboard": {"enabled": True},
}


class DemoError(RuntimeError):
    """Stops the demo with a message (and a hint) for the person running it."""


def step(message: str) -> None:
    print(f"\n==> {message}", flush=True)


def say(message: str) -> None:
    print(f"    {message}", flush=True)


# --- prerequisites ----------------------------------------------------------------------


def check_python() -> None:
    if sys.version_info < (3, 11):
        raise DemoError(f"Python 3.11+ is needed (this is {sys.version.split()[0]}). "
                        "Run `make venv` and use .venv/bin/python.")
    missing = []
    for module, package in (("yaml", "pyyaml"), ("cryptography", "cryptography"), ("kopf", "kopf"),
                            ("kubernetes_asyncio", "kubernetes-asyncio"), ("chattts_operator", "this project")):
        try:
            __import__(module)
        except ImportError:
            missing.append(package)
    if missing:
        raise DemoError(f"missing Python packages: {', '.join(missing)}. Run `make venv` "
                        f"(or `pip install -e '.[test]'`) and start the demo with .venv/bin/python.")


def check_tools(bin_dir: Path) -> None:
    import localcluster

    try:
        localcluster.find_kubectl(bin_dir)
    except localcluster.ClusterError:
        raise DemoError("kubectl not found: install it (any version within one minor of "
                        f"{localcluster.read_versions()['KUBERNETES_VERSION']}) and put it on PATH.") from None
    missing = localcluster.missing_binaries(bin_dir)
    if not missing:
        return
    if os.environ.get("CHATTTS_CLUSTER_BIN_DIR"):
        raise DemoError(f"CHATTTS_CLUSTER_BIN_DIR={bin_dir} lacks {', '.join(missing)}.")
    go = shutil.which("go")
    if not go:
        raise DemoError("the control-plane binaries are built from Go modules and `go` is not on PATH: "
                        "install Go 1.26+ (https://go.dev/doc/install), or point CHATTTS_CLUSTER_BIN_DIR "
                        "at a folder with etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok, helm.")
    version = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True).stdout.strip()
    major_minor = tuple(int(x) for x in version.removeprefix("go").split(".")[:2] if x.isdigit())
    if major_minor < (1, 26):
        raise DemoError(f"Go 1.26+ is needed to build the binaries (found {version}).")
    cache = bin_dir.parents[1]
    cache.mkdir(parents=True, exist_ok=True)
    free_gb = shutil.disk_usage(cache).free / 2**30
    if free_gb < 6:
        raise DemoError(f"only {free_gb:.1f} GiB free under {cache}: the first build needs about 6 GiB "
                        "(module downloads and the Go build cache).")


# --- binaries ---------------------------------------------------------------------------


def build_binaries(bin_dir: Path) -> None:
    """Run hack/cluster/build.sh, relaying its progress and saying it is still alive."""
    import localcluster

    missing = localcluster.missing_binaries(bin_dir)
    if not missing:
        say(f"binaries: {bin_dir} (cached)")
        return
    say(f"building {', '.join(missing)} from Go modules into {bin_dir}")
    say("the first build takes 20-40 minutes on a small machine (later runs reuse the cache)")
    started = time.monotonic()
    last_line = [time.monotonic()]
    process = subprocess.Popen([str(REPO / "hack" / "cluster" / "build.sh")], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(30):
            if time.monotonic() - last_line[0] >= 30:
                say(f"... still building ({(time.monotonic() - started) / 60:.0f} min so far)")

    threading.Thread(target=heartbeat, daemon=True).start()
    tail: list[str] = []
    assert process.stderr is not None
    for line in process.stderr:
        last_line[0] = time.monotonic()
        line = line.rstrip()
        tail = (tail + [line])[-30:]
        if line.startswith("[build]"):
            say(line)
    process.wait()
    done.set()
    if process.returncode != 0:
        raise DemoError("building the binaries failed; the last lines were:\n" + "\n".join(tail))
    say(f"binaries built in {(time.monotonic() - started) / 60:.1f} min")


# --- cluster and chart ------------------------------------------------------------------


def start_cluster(bin_dir: Path):
    import localcluster

    cluster = localcluster.LocalCluster(CLUSTER_NAME, bin_dir=bin_dir)
    if cluster.state_file.exists() and cluster.is_running():
        say(f"reusing the running cluster {CLUSTER_NAME!r} ({cluster.server})")
    else:
        started = time.monotonic()
        try:
            cluster.start()
        except localcluster.ClusterError as err:
            raise DemoError(f"the local cluster did not start: {err}\n"
                            f"    component logs: {cluster.logs}/") from None
        say(f"cluster {CLUSTER_NAME!r} up in {time.monotonic() - started:.0f} s at {cluster.server}")
    nodes = cluster.kubectl("get", "nodes", "-o", "name").stdout.split()
    say(f"{len(nodes)} simulated GPU nodes: {', '.join(n.removeprefix('node/') for n in nodes)}")
    return cluster


def adopt_crds(cluster) -> None:
    """CRDs applied earlier with kubectl (not by this release) are handed to the release, the way
    Helm documents it; otherwise `helm install` refuses to touch them."""
    import yaml

    for path in sorted((CHART / "files" / "crds").glob("*.yaml")):
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        if cluster.kubectl("get", "crd", name, check=False).returncode == 0:
            cluster.kubectl("annotate", "--overwrite", "crd", name, f"meta.helm.sh/release-name={RELEASE}",
                            f"meta.helm.sh/release-namespace={OPERATOR_NAMESPACE}")
            cluster.kubectl("label", "--overwrite", "crd", name, "app.kubernetes.io/managed-by=Helm")


def install_chart(cluster) -> list[dict[str, Any]]:
    """helm upgrade --install (idempotent); returns the release's manifest objects."""
    import yaml

    adopt_crds(cluster)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as values:
        yaml.safe_dump(DEMO_VALUES, values)
    try:
        cluster.helm("upgrade", "--install", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE,
                     "--create-namespace", "--values", values.name, "--wait", "--timeout", f"{int(TIMEOUT)}s",
                     timeout=TIMEOUT + 60)
    finally:
        os.unlink(values.name)
    history = json.loads(cluster.helm("history", RELEASE, "-n", OPERATOR_NAMESPACE, "-o", "json").stdout)
    say(f"release {RELEASE!r} revision {history[-1]['revision']} {history[-1]['status']} "
        f"in namespace {OPERATOR_NAMESPACE}")
    pods = cluster.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}",
                           "-o", "custom-columns=POD:.metadata.name,NODE:.spec.nodeName,READY:.status.conditions[?(@.type=='Ready')].status",
                           "--no-headers").stdout.strip()
    say(f"operator pod (simulated by kwok, no container runs): {' '.join(pods.split())}")
    manifest = cluster.helm("get", "manifest", RELEASE, "-n", OPERATOR_NAMESPACE).stdout
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


# --- the real operator, as a local process ------------------------------------------------


def _operator_files(cluster) -> tuple[Path, Path, Path]:
    return cluster.dir / "operator.pid", cluster.dir / "operator.log", cluster.dir / "operator.kubeconfig"


def _is_our_operator(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(b"chattts_operator" in part for part in cmdline)


def stop_operator(cluster) -> bool:
    pid_file, _, _ = _operator_files(cluster)
    try:
        pid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return False
    stopped = False
    if _is_our_operator(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)  # it leads its own session
        deadline = time.monotonic() + 20
        while _is_our_operator(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _is_our_operator(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        stopped = True
    pid_file.unlink(missing_ok=True)
    return stopped


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _operator_kubeconfig(cluster, service_account: str, path: Path) -> None:
    """A kubeconfig that authenticates as the chart's ServiceAccount (TokenRequest API)."""
    import yaml

    token = cluster.kubectl("create", "token", service_account, "-n", OPERATOR_NAMESPACE,
                            f"--duration={TOKEN_DURATION}").stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    cluster_entry = admin["clusters"][0]["cluster"]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": CLUSTER_NAME, "cluster": cluster_entry}],
        "users": [{"name": f"system:serviceaccount:{OPERATOR_NAMESPACE}:{service_account}", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": CLUSTER_NAME, "namespace": OPERATOR_NAMESPACE,
                                                      "user": f"system:serviceaccount:{OPERATOR_NAMESPACE}:{service_account}"}}],
        "current-context": "operator",
    }))
    path.chmod(0o600)


def run_operator(cluster, release_objects: list[dict[str, Any]]) -> tuple[int, str, str]:
    """(Re)start `chattts-operator run` in the background with the settings the chart gives the
    in-cluster operator. Returns (pid, health URL, metrics URL)."""
    pid_file, log_file, kubeconfig = _operator_files(cluster)
    if stop_operator(cluster):
        say("stopped the operator process of a previous run")
    (deployment,) = [o for o in release_objects if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    _operator_kubeconfig(cluster, pod["serviceAccountName"], kubeconfig)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATTTS_OPERATOR_")}
    env.update({e["name"]: e["value"] for e in pod["containers"][0]["env"] if "value" in e})
    health_port, metrics_port = _free_port(), _free_port()
    env.update({"KUBECONFIG": str(kubeconfig), "CHATTTS_OPERATOR_HEALTH_PORT": str(health_port),
                "CHATTTS_OPERATOR_METRICS_PORT": str(metrics_port), "PYTHONUNBUFFERED": "1"})
    health = f"http://127.0.0.1:{health_port}/healthz"
    with open(log_file, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "chattts_operator", "run", "--all-namespaces", "--verbose", "--liveness", health],
            env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)  # survives this script; stopped by demo-down
    pid_file.write_text(f"{process.pid}\n")
    deadline = time.monotonic() + 90
    while True:
        if process.poll() is not None:
            raise DemoError(f"the operator exited with code {process.returncode}; its log ({log_file}) ends with:\n"
                            + "\n".join(log_file.read_text(errors="replace").splitlines()[-25:]))
        with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
            with urllib.request.urlopen(health, timeout=2) as response:
                if response.status == 200:
                    break
        if time.monotonic() > deadline:
            raise DemoError(f"the operator's liveness endpoint {health} did not answer within 90 s; see {log_file}")
        time.sleep(0.5)
    return process.pid, health, f"http://127.0.0.1:{metrics_port}/metrics"


# --- samples ----------------------------------------------------------------------------


def _references(node: Any, claims: set[str], config_maps: set[str]) -> None:
    """PVC and ConfigMap names an object refers to (volumes, spec.model.pvc, quantization...)."""
    if isinstance(node, dict):
        if isinstance(node.get("claimName"), str):
            claims.add(node["claimName"])
        config_map = node.get("configMap")
        if isinstance(config_map, dict) and isinstance(config_map.get("name"), str):
            config_maps.add(config_map["name"])
        for value in node.values():
            _references(value, claims, config_maps)
    elif isinstance(node, list):
        for value in node:
            _references(value, claims, config_maps)


def sample_stand_ins(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stand-ins for what the samples expect a real cluster to have: a static hostPath volume and
    claim for every PVC they use but do not define, and every ConfigMap they read (calibration
    texts). Pure: the objects to apply."""
    claims: set[str] = set()
    config_maps: set[str] = set()
    for doc in documents:
        _references(doc, claims, config_maps)
    defined = {(d["kind"], d["metadata"]["name"]) for d in documents}
    objects: list[dict[str, Any]] = []
    for claim in sorted(c for c in claims if ("PersistentVolumeClaim", c) not in defined):
        volume = f"{DEMO_NAMESPACE}-{claim}"
        objects.append({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": volume, "labels": {"app.kubernetes.io/part-of": "chattts"}},
            "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteMany", "ReadOnlyMany"],
                     "storageClassName": "", "persistentVolumeReclaimPolicy": "Retain",
                     "claimRef": {"namespace": DEMO_NAMESPACE, "name": claim},
                     "hostPath": {"path": f"/srv/chattts-demo/{claim}", "type": "DirectoryOrCreate"}}})
        objects.append({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": DEMO_NAMESPACE},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": volume,
                     "resources": {"requests": {"storage": "10Gi"}}}})
    for name in sorted(c for c in config_maps if ("ConfigMap", c) not in defined):
        objects.append({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": DEMO_NAMESPACE},
            "data": {"texts.jsonl": '{"text": "Hello from the ChatTTS demo."}\n'}})
    return objects


def apply_examples(cluster) -> list[str]:
    import yaml

    cluster.kubectl("apply", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DEMO_NAMESPACE}}))
    for path in sorted((EXAMPLES / "local").glob("*.yaml")):
        cluster.kubectl("apply", "-f", str(path))  # cluster-scoped helpers (a static PV for the PVC example)
    documents = [doc for path in sorted(EXAMPLES.glob("*.yaml"))
                 for doc in yaml.safe_load_all(path.read_text()) if doc]
    stand_ins = sample_stand_ins(documents)
    if stand_ins:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(stand_ins))
        say("local stand-ins for what the samples expect to exist: "
            + ", ".join(f"{o['kind']}/{o['metadata']['name']}" for o in stand_ins if o["kind"] != "PersistentVolume"))
    applied = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        cluster.kubectl("apply", "-n", DEMO_NAMESPACE, "-f", str(path))
        applied.append(path.name)
    say(f"applied to namespace {DEMO_NAMESPACE}: {', '.join(applied)}")
    return applied


def _ctds(cluster) -> list[dict[str, Any]]:
    return cluster.kubectl_json("get", "ctd", "-n", DEMO_NAMESPACE)["items"]


def _serving(ctd: dict[str, Any]) -> bool:
    status = ctd.get("status") or {}
    return (status.get("observedGeneration") == ctd["metadata"]["generation"]
            and int(status.get("readyReplicas") or 0) >= 1
            and int(status.get("readyReplicas") or 0) == int(status.get("replicas") or -1))


def wait_for_serving(cluster) -> None:
    deadline = time.monotonic() + TIMEOUT
    reported = ""
    while True:
        ctds = _ctds(cluster)
        waiting = [c["metadata"]["name"] for c in ctds if not _serving(c)]
        if ctds and not waiting:
            break
        line = f"waiting for {', '.join(waiting)}" if waiting else "waiting for the ChatTTSDeployments"
        if line != reported:
            say(line)
            reported = line
        if time.monotonic() > deadline:
            table = cluster.kubectl("get", "ctd", "-n", DEMO_NAMESPACE).stdout
            why = [f"{c['metadata']['name']}: {cond['type']}={cond['status']} {cond.get('reason', '')}: {cond.get('message', '')}"
                   for c in ctds if not _serving(c)
                   for cond in (c.get("status") or {}).get("conditions") or []
                   if (cond["type"] == "Degraded") == (cond["status"] == "True")]
            raise DemoError(f"not every ChatTTSDeployment became ready within {TIMEOUT:.0f} s:\n{table}\n    "
                            + "\n    ".join(why)
                            + f"\n    see `kubectl describe ctd -n {DEMO_NAMESPACE}` and the operator log")
        time.sleep(1)


def check_pods(cluster) -> list[str]:
    """Every serving pod Running, with its GPU (a device-plugin limit, or a DRA claim) and the weights
    (and root fs) read-only."""
    pods = cluster.kubectl_json("get", "pods", "-n", DEMO_NAMESPACE, "-l", MANAGED_SELECTOR)["items"]
    if not pods:
        raise DemoError("no serving pods found")
    rows, problems = [], []
    for pod in pods:
        name = pod["metadata"]["name"]
        if pod["metadata"].get("deletionTimestamp"):
            continue
        container = pod["spec"]["containers"][0]
        limits = container.get("resources", {}).get("limits", {})
        gpu = {k: v for k, v in limits.items() if k.startswith(GPU_RESOURCE_PREFIXES)}
        # gpu.profile dra: the GPU comes from a ResourceClaim (the pod's template), no limit at all.
        gpu.update({f"dra/{c['name']}": "claim" for c in container.get("resources", {}).get("claims", [])})
        mount = next((m for m in container.get("volumeMounts", []) if m["mountPath"] == MODEL_MOUNT), None)
        root_ro = (container.get("securityContext") or {}).get("readOnlyRootFilesystem") is True
        phase = pod["status"].get("phase")
        if phase != "Running":
            problems.append(f"{name} is {phase}")
        if not gpu:
            problems.append(f"{name} has no GPU limit or claim")
        if not mount or not mount.get("readOnly"):
            problems.append(f"{name} does not mount {MODEL_MOUNT} read-only")
        if not root_ro:
            problems.append(f"{name} has a writable root filesystem")
        gpu_text = ",".join(f"{k.split('/', 1)[1]}={v}" for k, v in sorted(gpu.items()))
        rows.append(f"{name:<40} {phase:<8} {pod['spec'].get('nodeName', '-'):<16} {gpu_text:<34} "
                    f"{MODEL_MOUNT} {'ro' if mount and mount.get('readOnly') else 'RW'}, rootfs {'ro' if root_ro else 'RW'}")
    if problems:
        raise DemoError("serving pods are not as expected:\n    " + "\n    ".join(problems))
    return [f"{'POD':<40} {'PHASE':<8} {'NODE':<16} {'GPU':<34} MOUNTS", *rows]


def wait_for_pods(cluster, seconds: float = 120.0) -> list[str]:
    """``check_pods`` until it passes: a GPUSharePolicy window or a rollout may still be adding pods
    (Pending for a moment) when every ChatTTSDeployment already reports Ready."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return check_pods(cluster)
        except DemoError:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)


# --- commands ---------------------------------------------------------------------------


def up() -> None:
    import localcluster

    step("Checking prerequisites")
    check_python()
    bin_dir = localcluster.default_bin_dir()
    check_tools(bin_dir)
    say("python, kubectl, Go toolchain or prebuilt binaries: ok")

    step("Control-plane binaries (etcd, kube-apiserver, controller-manager, scheduler, kwok, helm)")
    build_binaries(bin_dir)

    step(f"Local cluster {CLUSTER_NAME!r}")
    cluster = start_cluster(bin_dir)

    step(f"Installing the chart with helm (release {RELEASE!r}, namespace {OPERATOR_NAMESPACE})")
    release_objects = install_chart(cluster)

    step("Starting the real operator as a local process (as the chart's ServiceAccount)")
    pid, health, metrics = run_operator(cluster, release_objects)
    pid_file, log_file, _ = _operator_files(cluster)
    say(f"pid {pid} (in {pid_file}); log {log_file}")
    say(f"liveness {health}; metrics {metrics}")

    step("Applying the samples in deploy/examples")
    apply_examples(cluster)

    step("Waiting until every ChatTTSDeployment serves (pods scheduled on GPU nodes, marked Running by kwok)")
    wait_for_serving(cluster)
    for row in wait_for_pods(cluster):
        say(row)

    step("kubectl get ctd -n " + DEMO_NAMESPACE)
    print(cluster.kubectl("get", "ctd", "-n", DEMO_NAMESPACE).stdout.rstrip())
    policies = cluster.kubectl("get", "gsp", check=False).stdout.rstrip()
    if policies:
        print()
        print(policies)

    print(f"""
Done. These ChatTTSDeployments were reconciled by the real operator running on this machine
(pid {pid}, as ServiceAccount {OPERATOR_NAMESPACE}/{RELEASE}); the operator pod that helm installed,
like every pod here, is simulated by kwok: scheduling is real, no container runs.

Use the cluster:
    export KUBECONFIG={cluster.kubeconfig}
    kubectl get ctd -A
    kubectl describe ctd -n {DEMO_NAMESPACE} chattts-hami
    tail -f {log_file}

Tear it down:
    make demo-down        (or hack/demo-down.sh; add --purge to delete {cluster.dir})""")


def down(purge: bool) -> None:
    import localcluster

    cluster = localcluster.LocalCluster(CLUSTER_NAME)
    step(f"Stopping the demo (cluster {CLUSTER_NAME!r})")
    if not cluster.dir.exists():
        say(f"nothing to stop: {cluster.dir} does not exist")
        return
    say("operator process stopped" if stop_operator(cluster) else "no operator process was running")
    cluster.stop(purge=purge)
    say(f"cluster stopped{' and its folder deleted' if purge else f'; its files stay in {cluster.dir}'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("up", "down"), nargs="?", default="up")
    parser.add_argument("--purge", action="store_true", help="down: also delete the cluster's folder")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            up()
        else:
            down(args.purge)
    except DemoError as err:
        print(f"\nerror: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted: run `make demo` again to continue, or `make demo-down` to clean up", file=sys.stderr)
        return 130
    except Exception as err:  # a ClusterError from a helm/kubectl call, say: say what failed, not a traceback
        if type(err).__name__ != "ClusterError":
            raise
        print(f"\nerror: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
