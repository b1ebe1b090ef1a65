"""Helpers shared by every test tier (fixtures are in the conftest.py files)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable
from bench.runtime.launch import free_port  # noqa: F401  (one port picker for tests and benches)

REPO = Path(__file__).resolve().parents[1]
CRD_DIR = REPO / "deploy" / "crds"


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 120, interval: float = 0.5) -> Any:
    """Poll until ``predicate()`` returns something truthy, and return it. An exception from
    the predicate is another "not yet"; the last one is reported on timeout."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            value = predicate()
        except Exception as err:  # keep polling; report the last error on timeout
            value, last = None, err
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}"
                                 + (f" (last error: {last!r})" if last else ""))
        time.sleep(interval)




# The default engine (graph) allocates (maxNumSeqs + 1) x maxModelLen x 60 KiB up front: at 512
# tokens up to 80 sequences fit in 8Gi (the default 2048 would not fit 64 there).
TEST_ENGINE = {"maxModelLen": 256}  # the graph engine (the default) fits 8Gi at up to 100 sequences


def ctd(name: str, **spec: Any) -> dict[str, Any]:
    """A ChatTTSDeployment that runs on the simulated GPU nodes: 2 replicas of 8Gi unless ``spec`` says
    otherwise; ``engine`` is merged into ``TEST_ENGINE``."""
    body = {"model": {"hostPath": {"path": "/srv/models/chattts"}, "format": "fp16"}, "gpu": {"memory": "8Gi"},
            "replicas": 2}
    body.update(spec)
    body["engine"] = {**TEST_ENGINE, **spec.get("engine", {})}
    return {"apiVersion": "tts.chattts.io/v1alpha1", "kind": "ChatTTSDeployment", "metadata": {"name": name},
            "spec": body}


def install_crds(cluster) -> None:
    """Apply every generated CRD (ChatTTSDeployment and GPUSharePolicy) and wait until it serves."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=chattts-tests",
                    "-f", str(CRD_DIR))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/chattsdeployments.tts.chattts.io", "crd/gpusharepolicies.tts.chattts.io")
    # Discovery may lag the Established condition by a moment.
    wait_until(lambda: cluster.kubectl("get", "ctd,gsp", "-A", check=False).returncode == 0,
               "the ctd/gsp resources to become servable", timeout=30, interval=0.3)


def token_kubeconfig(admin_kubeconfig: Path, token: str, path: Path, *, mode: int = 0o600) -> Path:
    """A kubeconfig for the local cluster that holds only ``token`` (a ServiceAccount's), so what
    uses it has exactly that identity's rights. ``mode`` 0o644 lets a container's user read it."""
    import yaml  # noqa: PLC0415

    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster_entry = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster_entry["cluster"]}],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "local", "user": "operator"}}],
        "current-context": "operator"}))
    path.chmod(mode)
    return path


def apply_chart_identity(cluster, objects: list[dict], rbac_kinds) -> list[dict]:
    """From a rendered chart: its CRDs (server-side, as an admin installs them, waited until
    Established) and its RBAC objects applied; returns the RBAC objects for clean-up."""
    import yaml  # noqa: PLC0415

    crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    rbac = [o for o in objects if o["kind"] in rbac_kinds]
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=chattts-tests", "-f", "-",
                    input=yaml.safe_dump_all(crds))
    for crd in crds:
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd['metadata']['name']}")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    return rbac


def normalizers_site() -> tuple[Path, Path]:
    """The language normalizers hack/setup-venv.sh installs apart (``.venv/normalizers-site``) and the folder
    of nemo's compiled grammars beside them; ``CHATTTS_NORMALIZERS_SITE`` / ``CHATTTS_NORMALIZER_GRAMMARS``
    override. A missing folder fails the test with the install hint (the image carries them: never skipped)."""
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415

    import pytest  # noqa: PLC0415

    site = Path(os.environ.get("CHATTTS_NORMALIZERS_SITE", Path(sys.prefix) / "normalizers-site"))
    grammars = Path(os.environ.get("CHATTTS_NORMALIZER_GRAMMARS",
                                   Path(sys.prefix) / "share" / "chattts-runtime" / "grammars"))
    if not (site / "tn").is_dir() or not (site / "nemo_text_processing").is_dir() or not grammars.is_dir():
        pytest.fail(f"the language normalizers are not installed in {site} (grammars: {grammars}); run "
                    "hack/setup-venv.sh (tests/runtime/normalizers-requirements.txt)", pytrace=False)
    return site, grammars


class RunningServer:
    """A ``chattts-runtime serve`` subprocess on loopback (``launch_server``)."""

    def __init__(self, proc, url: str, log_path: Path):
        self.proc, self.url, self.log_path = proc, url, log_path

    def client(self, **kw):
        import httpx  # noqa: PLC0415

        return httpx.Client(base_url=self.url, timeout=kw.pop("timeout", 60.0), **kw)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, list]:
        import httpx  # noqa: PLC0415
        from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

        text = httpx.get(self.url + "/metrics", timeout=10).text
        return {f.name: f.samples for f in text_string_to_metric_families(text)}


def wait_ready(url: str, proc, log_path: Path, timeout: float = 120.0) -> None:
    import httpx  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server not ready after {timeout}s:\n{log_path.read_text()[-4000:]}")


def launch_server(config: dict, workdir: Path, env_extra: dict[str, str] | None = None,
                  timeout: float = 120.0) -> RunningServer:
    """``chattts-runtime serve`` with ``config`` (its port set) as a subprocess, once ready; stop it by pid.
    ``env_extra``: more environment for it (``PYTHONPATH`` for packages installed apart). The one launcher
    of the runtime's server for the runtime and vllm tiers."""
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    import yaml  # noqa: PLC0415

    port = config["server"]["port"]
    cfg_path = workdir / f"runtime-{port}.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    log_path = workdir / f"server-{port}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATTTS_")}
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "2")
    env.update(env_extra or {})
    proc = subprocess.Popen([sys.executable, "-m", "chattts_runtime", "serve", "--config", str(cfg_path)],
                            stdout=log_path.open("w"), stderr=subprocess.STDOUT, env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log_path, timeout)
    except BaseException:
        proc.kill()
        proc.wait(timeout=30)
        raise
    return RunningServer(proc, url, log_path)
