#!/usr/bin/env python3
"""Start and stop a real local Kubernetes control plane with simulated GPU nodes.

    python hack/cluster/localcluster.py up     [--name NAME] [--nodes FILE]
    python hack/cluster/localcluster.py status [--name NAME]
    python hack/cluster/localcluster.py env    [--name NAME]   # prints `export KUBECONFIG=...`
    python hack/cluster/localcluster.py down   [--name NAME] [--purge]

The processes are the binaries build.sh produces (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok), each in its own process group
on 127.0.0.1 ports chosen at start. kwok plays the kubelet of the nodes in
nodes.yaml, so the real scheduler places pods by their GPU resources and kwok
marks them Running/Ready (or Succeeded for Jobs).

Everything of one cluster lives in ``$CHATTTS_CLUSTER_HOME/<name>/`` (default
``~/.cache/chattts-operator/clusters/<name>/``): ``kubeconfig``, ``pki/``,
``logs/<component>.log``, ``run/<component>.pid``, ``etcd/`` and
``state.json`` (the ports), so any process can find and stop it.

Needs Python 3.11+, ``cryptography`` and ``pyyaml``.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import fcntl
import ipaddress
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import draslices  # noqa: E402
import gpunodes  # noqa: E402  (sibling module; works without installing anything)

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
BINARIES = COMPONENTS + ("helm",)
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
POD_CIDR = "10.244.0.0/16"
# DRAConsumableCapacity (KEP-5075) is beta and on by default in 1.36: named so the simulated
# shared GPUs (draslices.py) keep working where the default differs.
FEATURE_GATES = "ImageVolume=true,DRAConsumableCapacity=true"
KWOK_STAGES = ("node-initialize.yaml", "node-heartbeat-with-lease.yaml", "pod-ready.yaml",
               "pod-complete.yaml", "pod-delete.yaml")


class ClusterError(RuntimeError):
    """The local cluster could not be started, reached or stopped."""


# ---------------------------------------------------------------------------
# Locations


def read_versions(path: Path = HERE / "versions.env") -> dict[str, str]:
    versions = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            versions[key.strip()] = value.strip()
    return versions


def _goarch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def cache_key(versions: dict[str, str]) -> str:
    """The folder name build.sh uses under its cache (keep the two in step)."""
    return (f"k8s-{versions['KUBERNETES_VERSION']}_etcd-{versions['ETCD_VERSION']}"
            f"_kwok-{versions['KWOK_VERSION']}_helm-{versions['HELM_VERSION']}"
            f"_{platform.system().lower()}-{_goarch()}")


def default_bin_dir() -> Path:
    """CHATTTS_CLUSTER_BIN_DIR if set, else build.sh's cache folder for the pinned versions."""
    if os.environ.get("CHATTTS_CLUSTER_BIN_DIR"):
        return Path(os.environ["CHATTTS_CLUSTER_BIN_DIR"]).expanduser()
    cache = os.environ.get("CHATTTS_CLUSTER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "chattts-operator", "cluster")
    return Path(cache) / "bin" / cache_key(read_versions())


def default_home() -> Path:
    home = os.environ.get("CHATTTS_CLUSTER_HOME") or os.path.expanduser("~/.cache/chattts-operator/clusters")
    return Path(home)


def missing_binaries(bin_dir: Path) -> list[str]:
    missing = [name for name in BINARIES if not os.access(bin_dir / name, os.X_OK)]
    if not (bin_dir / "kwok-stages").is_dir():
        missing.append("kwok-stages/")
    return missing


def find_kubectl(bin_dir: Path | None) -> str:
    """kubectl from the binary folder (matches the server version), else from PATH."""
    if bin_dir is not None and os.access(bin_dir / "kubectl", os.X_OK):
        return str(bin_dir / "kubectl")
    found = shutil.which("kubectl")
    if not found:
        raise ClusterError("kubectl not found: run hack/cluster/build.sh or put kubectl on PATH")
    return found


# ---------------------------------------------------------------------------
# PKI


def _write_private(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def write_pki(pki: Path) -> None:
    """CA, API server serving cert, client certs and the service-account key pair."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    pki.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)

    def key_pem(key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    def name(cn: str, org: str | None = None) -> x509.Name:
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        if org:
            attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
        return x509.Name(attrs)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name("chattts-local-ca")
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now).not_valid_after(now + dt.timedelta(days=3650))
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))

    def issue(stem: str, subject: x509.Name, server: bool) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now).not_valid_after(now + dt.timedelta(days=365))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(
                       [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.DNSName("kubernetes"), x509.DNSName("kubernetes.default"),
                x509.DNSName("kubernetes.default.svc"), x509.DNSName("kubernetes.default.svc.cluster.local"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address(KUBERNETES_SERVICE_IP)),
            ]), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        (pki / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(pki / f"{stem}.key", key_pem(key))

    issue("apiserver", name("kube-apiserver"), server=True)
    issue("admin", name("kubernetes-admin", "system:masters"), server=False)
    issue("kube-controller-manager", name("system:kube-controller-manager"), server=False)
    issue("kube-scheduler", name("system:kube-scheduler"), server=False)
    # kwok writes the status of every node and pod, beyond what the Node authorizer allows a kubelet.
    issue("kwok", name("kwok-controller", "system:masters"), server=False)
    # The API server's identity towards aggregated API servers (front proxy).
    issue("front-proxy-client", name("front-proxy-client"), server=False)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_private(pki / "sa.key", key_pem(sa_key))
    (pki / "sa.pub").write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    # The CA last: its presence marks a complete PKI folder.
    _write_private(pki / "ca.key", key_pem(ca_key))
    (pki / "ca.crt").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))


PKI_FILES = ("ca.crt", "ca.key", "sa.key", "sa.pub") + tuple(
    f"{stem}.{ext}" for stem in ("apiserver", "admin", "kube-controller-manager", "kube-scheduler", "kwok",
                                 "front-proxy-client") for ext in ("crt", "key"))


def pki_complete(pki: Path) -> bool:
    """Whether write_pki() has produced every file (a PKI from an older version is redone)."""
    return all((pki / f).exists() for f in PKI_FILES)


def kubeconfig_document(cluster_name: str, server: str, pki: Path, user: str) -> dict[str, Any]:
    """A kubeconfig with the CA and the user's client cert embedded (portable, no paths)."""
    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": {
            "server": server, "certificate-authority-data": b64(pki / "ca.crt")}}],
        "users": [{"name": user, "user": {
            "client-certificate-data": b64(pki / f"{user}.crt"),
            "client-key-data": b64(pki / f"{user}.key")}}],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": user}}],
        "current-context": cluster_name,
        "preferences": {},
    }


# ---------------------------------------------------------------------------
# Processes and ports


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for clients' local ports (Linux default 32768-60999)."""
    with contextlib.suppress(OSError, ValueError):
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    return 32768, 60999


def free_ports(count: int) -> list[int]:
    """Distinct free TCP ports on 127.0.0.1 (all held open until every one is chosen).

    They lie outside the kernel's ephemeral range: a component restarted on its old port
    (fault tests) must find it free, and while it was down any client connection on the host
    could otherwise have been given that port as its local end."""
    low, high = _ephemeral_range()
    spans = [(span_low, span_high) for span_low, span_high in ((10000, low - 1), (high + 1, 65535))
             if span_high - span_low > 1000]
    rng = random.Random()
    sockets: list[socket.socket] = []
    try:
        for _ in range(200 * count):
            if len(sockets) == count:
                break
            span_low, span_high = rng.choice(spans) if spans else (0, 0)
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                # Without spans (an unusual kernel setting) let the kernel choose.
                s.bind(("127.0.0.1", rng.randint(span_low, span_high) if spans else 0))
            except OSError:
                s.close()
                continue
            sockets.append(s)
        if len(sockets) < count:
            raise ClusterError(f"found only {len(sockets)} of {count} free ports outside {low}-{high}")
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def listening_ports(candidates: set[int]) -> set[int]:
    """Which of these TCP ports have a listening socket on this host (from /proc/net)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 3 and fields[3] == "0A":  # TCP_LISTEN
                    port = int(fields[1].rsplit(":", 1)[1], 16)
                    if port in candidates:
                        found.add(port)
    return found


def process_state(pid: int) -> str | None:
    """The state letter of a process, or None if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def process_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def processes_mentioning(text: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains ``text``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid == os.getpid():
            continue
        cmdline = process_cmdline(pid)
        if cmdline and any(text in arg for arg in cmdline) and process_state(pid) not in (None, "Z"):
            pids.append(pid)
    return pids


def _http_get(url: str, context: ssl.SSLContext | None = None, timeout: float = 3) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


@dataclass
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int

    @classmethod
    def allocate(cls) -> "Ports":
        return cls(*free_ports(6))

    def all(self) -> set[int]:
        return set(vars(self).values())

    def of(self, component: str) -> set[int]:
        """The ports a component listens on."""
        return {
            "etcd": {self.etcd_client, self.etcd_peer},
            "kube-apiserver": {self.apiserver},
            "kube-controller-manager": {self.controller_manager},
            "kube-scheduler": {self.scheduler},
            "kwok": {self.kwok},
        }[component]


# ---------------------------------------------------------------------------
# Clusters


class ClusterHandle:
    """Any reachable cluster: a kubeconfig plus kubectl/helm bound to it."""

    def __init__(self, kubeconfig: Path | str, bin_dir: Path | None = None, tool_home: Path | None = None):
        self.kubeconfig = Path(kubeconfig)
        self.bin_dir = bin_dir
        # helm keeps its config/cache/data here rather than in the user's home.
        self.tool_home = tool_home or default_home() / "_tools"

    def env(self) -> dict[str, str]:
        """os.environ with KUBECONFIG and helm's homes pointed at this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig),
                "HELM_CONFIG_HOME": str(self.tool_home / "helm-config"),
                "HELM_CACHE_HOME": str(self.tool_home / "helm-cache"),
                "HELM_DATA_HOME": str(self.tool_home / "helm-data")}

    def _run(self, argv: list[str], input: str | None, check: bool, timeout: float) -> subprocess.CompletedProcess:
        result = subprocess.run(argv, input=input, capture_output=True, text=True, env=self.env(),
                                timeout=timeout)
        if check and result.returncode != 0:
            command = " ".join([Path(argv[0]).name, *argv[1:]])
            raise ClusterError(f"{command} failed (exit {result.returncode}): "
                               f"{result.stderr.strip() or result.stdout.strip()}")
        return result

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess:
        """Run kubectl against this cluster; raises ClusterError on failure when check is set."""
        return self._run([find_kubectl(self.bin_dir), "--kubeconfig", str(self.kubeconfig), *args],
                         input, check, timeout)

    def kubectl_json(self, *args: str, timeout: float = 120) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json", timeout=timeout).stdout)

    def helm(self, *args: str, input: str | None = None, check: bool = True,
             timeout: float = 300) -> subprocess.CompletedProcess:
        helm = (self.bin_dir / "helm") if self.bin_dir and (self.bin_dir / "helm").exists() else shutil.which("helm")
        if not helm:
            raise ClusterError("helm not found: run hack/cluster/build.sh")
        return self._run([str(helm), "--kubeconfig", str(self.kubeconfig), *args], input, check, timeout)


class LocalCluster(ClusterHandle):
    """One local control plane, identified by its name (its folder under the clusters home)."""

    def __init__(self, name: str = "dev", home: Path | str | None = None, bin_dir: Path | str | None = None,
                 nodes_file: Path | str | None = None):
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", name or ""):
            raise ClusterError(f"invalid cluster name {name!r}: letters, digits, '.', '_' and '-' only")
        self.name = name
        self.dir = Path(home or default_home()).expanduser().resolve() / name
        super().__init__(self.dir / "kubeconfig", Path(bin_dir).expanduser() if bin_dir else default_bin_dir(),
                         self.dir / "tools")
        self.nodes_file = Path(nodes_file) if nodes_file else gpunodes.NODES_FILE
        self.pki = self.dir / "pki"
        self.logs = self.dir / "logs"
        self.run_dir = self.dir / "run"
        self.etcd_data = self.dir / "etcd"
        self.state_file = self.dir / "state.json"
        self._children: dict[str, subprocess.Popen] = {}

    # -- state ---------------------------------------------------------------

    @property
    def ports(self) -> Ports:
        try:
            return Ports(**json.loads(self.state_file.read_text())["ports"])
        except FileNotFoundError:
            raise ClusterError(f"cluster {self.name!r} has never been started ({self.state_file} missing)") from None

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise start/stop of this cluster across processes."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return context

    # -- component command lines -------------------------------------------

    def _kubeconfig_for(self, user: str) -> Path:
        return self.dir / f"{user}.kubeconfig"

    def command(self, component: str) -> list[str]:
        """The full command line of a component (deterministic given state.json)."""
        p, pki, ports = self.bin_dir, self.pki, self.ports
        if component == "etcd":
            peer, client = f"http://127.0.0.1:{ports.etcd_peer}", f"http://127.0.0.1:{ports.etcd_client}"
            return [str(p / "etcd"), "--name=node0", f"--data-dir={self.etcd_data}",
                    f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
                    f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=node0={peer}", "--initial-cluster-state=new",
                    "--quota-backend-bytes=2147483648", "--auto-compaction-mode=periodic",
                    "--auto-compaction-retention=5m", "--snapshot-count=10000",
                    # A throwaway test cluster: skip fsync, which dominates latency on a busy disk.
                    "--unsafe-no-fsync=true", "--log-level=warn"]
        if component == "kube-apiserver":
            return [str(p / "kube-apiserver"),
                    f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
                    "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                    f"--secure-port={ports.apiserver}",
                    f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
                    f"--client-ca-file={pki / 'ca.crt'}",
                    f"--service-account-key-file={pki / 'sa.pub'}",
                    f"--service-account-signing-key-file={pki / 'sa.key'}",
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                    # Front-proxy settings: aggregated APIs work, and the controller-manager and
                    # scheduler find the request-header CA they look up at start.
                    f"--requestheader-client-ca-file={pki / 'ca.crt'}",
                    "--requestheader-allowed-names=front-proxy-client",
                    "--requestheader-username-headers=X-Remote-User",
                    "--requestheader-group-headers=X-Remote-Group",
                    "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                    f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
                    f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
                    "--authorization-mode=Node,RBAC", "--allow-privileged=true",
                    "--enable-admission-plugins=NodeRestriction",
                    f"--feature-gates={FEATURE_GATES}",
                    # The advertise address is loopback, which Endpoints refuse; nothing runs in-cluster.
                    "--endpoint-reconciler-type=none",
                    "--profiling=false", "--event-ttl=1h"]
        if component == "kube-controller-manager":
            kc = self._kubeconfig_for("kube-controller-manager")
            return [str(p / "kube-controller-manager"),
                    f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
                    "--bind-address=127.0.0.1", f"--secure-port={ports.controller_manager}",
                    "--leader-elect=false", f"--cluster-name={self.name}",
                    "--controllers=*", "--use-service-account-credentials=true",
                    f"--root-ca-file={pki / 'ca.crt'}",
                    f"--service-account-private-key-file={pki / 'sa.key'}",
                    f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                    f"--cluster-signing-key-file={pki / 'ca.key'}",
                    f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                    "--kube-api-qps=100", "--kube-api-burst=200",
                    f"--feature-gates={FEATURE_GATES}", "--profiling=false"]
        if component == "kube-scheduler":
            kc = self._kubeconfig_for("kube-scheduler")
            return [str(p / "kube-scheduler"),
                    f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
                    "--bind-address=127.0.0.1", f"--secure-port={ports.scheduler}",
                    "--leader-elect=false", f"--feature-gates={FEATURE_GATES}", "--profiling=false"]
        if component == "kwok":
            return [str(p / "kwok"),
                    f"--kubeconfig={self._kubeconfig_for('kwok')}",
                    f"--config={self.dir / 'kwok.yaml'}",
                    "--manage-all-nodes=false",
                    f"--manage-nodes-with-annotation-selector={'='.join(gpunodes.KWOK_ANNOTATION)}",
                    f"--cidr={POD_CIDR}", "--node-ip=10.0.0.1",
                    f"--server-address=127.0.0.1:{ports.kwok}", f"--node-port={ports.kwok}",
                    "--node-lease-duration-seconds=40"]
        raise ClusterError(f"unknown component {component!r} (known: {', '.join(COMPONENTS)})")

    # -- processes -----------------------------------------------------------

    def _pid_file(self, component: str) -> Path:
        return self.run_dir / f"{component}.pid"

    def pid(self, component: str) -> int | None:
        """The pid of the component if it is running (checked against its command line)."""
        child = self._children.get(component)
        if child is not None:
            child.poll()  # reap it if it exited, so it does not linger as a zombie
        try:
            pid = int(self._pid_file(component).read_text())
        except (FileNotFoundError, ValueError):
            return None
        cmdline = process_cmdline(pid)
        if not cmdline and child is not None and child.pid == pid and child.returncode is None:
            # Our own child in the middle of exec: the new command line is not set up yet.
            return pid
        # The binary must be this cluster's: after a version bump, a kept cluster running
        # older binaries counts as stopped (start() then replaces it, stop() sweeps it).
        if process_state(pid) in (None, "Z") or not cmdline \
                or os.path.abspath(cmdline[0]) != os.path.abspath(self.bin_dir / component) \
                or not any(str(self.dir) in arg for arg in cmdline):
            return None
        return pid

    def _spawn(self, component: str) -> None:
        argv = self.command(component)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "HTTPS_PROXY", "HTTP_PROXY")}
        with open(self.logs / f"{component}.log", "ab") as log:
            log.write(f"\n=== {dt.datetime.now().isoformat()} starting: {' '.join(argv)}\n".encode())
            log.flush()
            # Own session and process group: survives the CLI that started it, and
            # stop() can signal the whole group.
            child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     cwd=self.dir, env=env, start_new_session=True)
        self._children[component] = child
        self._pid_file(component).write_text(str(child.pid))

    def _exit_detail(self, component: str) -> str:
        child = self._children.get(component)
        if child is not None and child.poll() is not None:
            return f"exit status {child.returncode}"
        with contextlib.suppress(FileNotFoundError, ValueError):
            pid = int(self._pid_file(component).read_text())
            return f"pid {pid}, state {process_state(pid)}, command {' '.join(process_cmdline(pid))[:200]!r}"
        return "no pid file"

    def _log_tail(self, component: str, lines: int = 30) -> str:
        with contextlib.suppress(FileNotFoundError):
            return "\n".join((self.logs / f"{component}.log").read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def healthy(self, component: str) -> bool:
        """Whether the component runs and answers its health endpoint."""
        if self.pid(component) is None:
            return False
        ports = self.ports
        try:
            if component == "etcd":
                status, body = _http_get(f"http://127.0.0.1:{ports.etcd_client}/health")
                return status == 200 and json.loads(body).get("health") == "true"
            if component == "kube-apiserver":
                status, _ = _http_get(f"{self.server}/readyz", self._ssl_context())
                return status == 200
            if component in ("kube-controller-manager", "kube-scheduler"):
                port = ports.controller_manager if component == "kube-controller-manager" else ports.scheduler
                insecure = ssl.create_default_context()
                insecure.check_hostname = False
                insecure.verify_mode = ssl.CERT_NONE  # self-signed serving cert made at start
                status, _ = _http_get(f"https://127.0.0.1:{port}/healthz", insecure)
                return status == 200
            if component == "kwok":
                status, _ = _http_get(f"http://127.0.0.1:{ports.kwok}/healthz")
                return status == 200
        except (OSError, ValueError, ssl.SSLError):
            return False
        raise ClusterError(f"unknown component {component!r}")

    def _wait_healthy(self, component: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.healthy(component):
                return
            if self.pid(component) is None:
                raise ClusterError(f"{component} exited during start ({self._exit_detail(component)}); last log lines "
                                   f"({self.logs / (component + '.log')}):\n{self._log_tail(component)}")
            time.sleep(0.25)
        raise ClusterError(f"{component} not healthy after {timeout:.0f} s; last log lines:\n"
                           f"{self._log_tail(component)}")

    def start_component(self, component: str, timeout: float = 180) -> None:
        """Start one component (if not running) and wait until it is healthy."""
        if component not in COMPONENTS:
            raise ClusterError(f"unknown component {component!r} (known: {', '.join(COMPONENTS)})")
        if self.pid(component) is None:
            self._spawn(component)
        self._wait_healthy(component, timeout)

    def stop_component(self, component: str, sig: int = signal.SIGTERM, timeout: float | None = None) -> None:
        """Signal the component's process group and wait for it to go (SIGKILL after timeout)."""
        if timeout is None:
            # kube-apiserver drains open watches for up to --request-timeout (60 s) after
            # SIGTERM; its state is all in etcd, so a test cluster need not wait that long.
            timeout = 5 if component == "kube-apiserver" else 15
        pid = self.pid(component)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
            if not self._wait_gone(component, pid, timeout):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                if not self._wait_gone(component, pid, 10):
                    raise ClusterError(f"{component} (pid {pid}) survived SIGKILL")
            # A killed Go process's leader turns zombie before its other threads have let go
            # of the sockets: a restart on the same ports must wait for them to close.
            ports = self.ports.of(component)
            self._wait_for(lambda: not listening_ports(ports), f"{component}'s ports to close", 15)
        self._pid_file(component).unlink(missing_ok=True)
        self._children.pop(component, None)

    def _wait_gone(self, component: str, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            child = self._children.get(component)
            if child is not None and child.pid == pid:
                child.poll()
            if process_state(pid) in (None, "Z"):
                return True
            time.sleep(0.1)
        return False

    def restart(self, component: str, sig: int = signal.SIGTERM, timeout: float = 180) -> None:
        """Stop (with ``sig``; SIGKILL simulates a crash) and start one component, same ports and data."""
        self.stop_component(component, sig=sig)
        self.start_component(component, timeout=timeout)

    # -- whole cluster -------------------------------------------------------

    def wait_healthy(self, timeout: float = 120) -> None:
        """Wait until every component answers its health check (after a restart, say)."""
        for component in COMPONENTS:
            self._wait_healthy(component, timeout)

    def is_running(self) -> bool:
        """All components up and healthy."""
        if not self.state_file.exists():
            return False
        return all(self.healthy(c) for c in COMPONENTS)

    def status(self) -> dict[str, dict[str, Any]]:
        state = self.state_file.exists()
        return {c: {"pid": self.pid(c), "healthy": state and self.healthy(c)} for c in COMPONENTS}

    def start(self, timeout: float = 300) -> "LocalCluster":
        """Start the cluster, or reuse it if every component is already healthy.

        A partly running or stale cluster is stopped and started afresh (new
        ports, empty etcd); the PKI is kept.
        """
        missing = missing_binaries(self.bin_dir)
        if missing:
            raise ClusterError(f"binaries missing in {self.bin_dir}: {', '.join(missing)}; "
                               "run hack/cluster/build.sh (or set CHATTTS_CLUSTER_BIN_DIR)")
        node_specs = gpunodes.load_nodes(self.nodes_file)  # bad nodes file fails before anything starts
        with self._locked():
            if self.is_running():
                self._apply_nodes(node_specs)
                draslices.apply(self.api, draslices.manifests(node_specs))
                return self
            self._stop_all()
            shutil.rmtree(self.etcd_data, ignore_errors=True)
            if not pki_complete(self.pki):
                shutil.rmtree(self.pki, ignore_errors=True)
                write_pki(self.pki)
            state = self.state_file.with_suffix(".tmp")
            state.write_text(json.dumps({
                "name": self.name, "bin_dir": str(self.bin_dir), "ports": vars(Ports.allocate()),
                "started": dt.datetime.now(dt.timezone.utc).isoformat()}, indent=2))
            state.replace(self.state_file)  # readers never see a half-written file
            self._write_configs()
            deadline = time.monotonic() + timeout
            try:
                self.start_component("etcd", timeout=60)
                self.start_component("kube-apiserver", timeout=max(10.0, deadline - time.monotonic()))
                for component in ("kube-controller-manager", "kube-scheduler", "kwok"):
                    self._spawn(component)
                for component in ("kube-controller-manager", "kube-scheduler", "kwok"):
                    self._wait_healthy(component, max(10.0, deadline - time.monotonic()))
                self._apply_nodes(node_specs)
                draslices.apply(self.api, draslices.manifests(node_specs))
                self._wait_nodes_ready([s.name for s in node_specs], max(10.0, deadline - time.monotonic()))
                self._wait_for(lambda: self.api("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
                               "the default ServiceAccount", max(10.0, deadline - time.monotonic()))
            except BaseException:
                self._stop_all()
                raise
        return self

    def stop(self, purge: bool = False) -> None:
        """Stop every component (and any stray process of this cluster); ``purge`` deletes the folder."""
        if not self.dir.exists():
            return
        with self._locked():
            self._stop_all()
        if purge:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _stop_all(self) -> None:
        stopped = [c for c in reversed(COMPONENTS) if self.pid(c) is not None]
        for component in reversed(COMPONENTS):
            self.stop_component(component)
        # Anything else still running from this cluster's folder (a pid file lost, say).
        for pid in processes_mentioning(str(self.dir) + "/"):
            cmdline = process_cmdline(pid)
            if cmdline and Path(cmdline[0]).name in COMPONENTS:
                stopped.append(Path(cmdline[0]).name)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self._wait_for(lambda: process_state(pid) in (None, "Z"), f"stray pid {pid} to exit", 10)
        # Only ports this cluster held; after a long stop another program may own them.
        if stopped and self.state_file.exists():
            ports = self.ports.all()
            self._wait_for(lambda: not listening_ports(ports), "the cluster's ports to close", 15)

    def _write_configs(self) -> None:
        server = self.server
        for user in ("admin", "kube-controller-manager", "kube-scheduler", "kwok"):
            path = self.kubeconfig if user == "admin" else self._kubeconfig_for(user)
            path.write_text(yaml.safe_dump(kubeconfig_document(self.name, server, self.pki, user), sort_keys=False))
            path.chmod(0o600)
        stages = self.bin_dir / "kwok-stages"
        (self.dir / "kwok.yaml").write_text(
            "\n---\n".join((stages / stage).read_text().strip() for stage in KWOK_STAGES) + "\n")

    # -- API -----------------------------------------------------------------

    def api(self, method: str, path: str, body: Any = None,
            content_type: str = "application/json") -> tuple[int, Any]:
        """One request to the API server as admin, in process: (HTTP status, decoded body)."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.server + path, data=data, method=method,
                                         headers={"Content-Type": content_type, "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, context=self._ssl_context(), timeout=15) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as err:
            raw = err.read()
            with contextlib.suppress(ValueError):
                return err.code, json.loads(raw)
            return err.code, raw.decode(errors="replace")

    def _apply_nodes(self, specs: list[gpunodes.NodeSpec]) -> None:
        """Create the simulated nodes, or bring existing ones back to the declared labels and resources."""
        for manifest in gpunodes.node_manifests(specs):
            name = manifest["metadata"]["name"]
            status, body = self.api("POST", "/api/v1/nodes", manifest)
            if status == 409:
                status, body = self.api("PATCH", f"/api/v1/nodes/{name}",
                                         {"metadata": {"labels": manifest["metadata"]["labels"],
                                                       "annotations": manifest["metadata"]["annotations"]}},
                                         "application/merge-patch+json")
            if status >= 300:
                raise ClusterError(f"creating node {name} failed ({status}): {body}")
            # The create keeps status for nodes today, but make sure: kwok carries over
            # whatever capacity/allocatable the object has when it initialises the node.
            want = manifest["status"]
            have = body.get("status", {}) if isinstance(body, dict) else {}
            if have.get("capacity") != want["capacity"] or have.get("allocatable") != want["allocatable"]:
                status, body = self.api("PATCH", f"/api/v1/nodes/{name}/status",
                                         {"status": {"capacity": want["capacity"],
                                                     "allocatable": want["allocatable"]}},
                                         "application/merge-patch+json")
                if status >= 300:
                    raise ClusterError(f"setting the status of node {name} failed ({status}): {body}")

    def _wait_nodes_ready(self, names: list[str], timeout: float) -> None:
        def all_ready() -> bool:
            status, body = self.api("GET", "/api/v1/nodes")
            if status != 200:
                return False
            ready = {n["metadata"]["name"] for n in body["items"]
                     if any(c["type"] == "Ready" and c["status"] == "True"
                            for c in n.get("status", {}).get("conditions", []))}
            return set(names) <= ready
        self._wait_for(all_ready, f"nodes {', '.join(names)} to become Ready (kwok)", timeout)

    def _wait_for(self, predicate, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError):
                if predicate():
                    return
            if time.monotonic() >= deadline:
                raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.25)

    @classmethod
    def from_kubeconfig(cls, kubeconfig: Path | str) -> ClusterHandle:
        """A LocalCluster if the kubeconfig is one this module wrote, else a plain handle."""
        path = Path(kubeconfig).expanduser().resolve()
        if path.name == "kubeconfig" and (path.parent / "state.json").exists():
            state = json.loads((path.parent / "state.json").read_text())
            return cls(path.parent.name, home=path.parent.parent, bin_dir=state.get("bin_dir"))
        bin_dir = default_bin_dir()
        return ClusterHandle(path, bin_dir if bin_dir.is_dir() else None)


# ---------------------------------------------------------------------------
# CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("up", "down", "status", "env"))
    parser.add_argument("--name", default=os.environ.get("CHATTTS_CLUSTER_NAME", "dev"),
                        help="cluster name (folder under $CHATTTS_CLUSTER_HOME); default dev")
    parser.add_argument("--nodes", help="simulated nodes file (default hack/cluster/nodes.yaml)")
    parser.add_argument("--bin-dir", help="binary folder (default $CHATTTS_CLUSTER_BIN_DIR or build.sh's cache)")
    parser.add_argument("--purge", action="store_true", help="down: also delete the cluster's folder")
    args = parser.parse_args(argv)
    try:
        cluster = LocalCluster(args.name, bin_dir=args.bin_dir, nodes_file=args.nodes)
        if args.command == "up":
            started = time.monotonic()
            cluster.start()
            print(f"cluster {cluster.name!r} ready in {time.monotonic() - started:.1f} s at {cluster.server}",
                  file=sys.stderr)
            print(f"export KUBECONFIG={cluster.kubeconfig}")
        elif args.command == "env":
            print(f"export KUBECONFIG={cluster.kubeconfig}")
        elif args.command == "down":
            cluster.stop(purge=args.purge)
            print(f"cluster {cluster.name!r} stopped", file=sys.stderr)
        else:
            report = cluster.status()
            for component, info in report.items():
                state = "healthy" if info["healthy"] else ("running" if info["pid"] else "stopped")
                print(f"{component:24} {state:8} pid={info['pid'] or '-'}")
            return 0 if all(info["healthy"] for info in report.values()) else 1
    except (ClusterError, gpunodes.NodesFileError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
