"""The one way a benchmark starts ``chattts-runtime serve``: its config built by the runtime's own model.

Every runtime benchmark describes the server it wants as a :class:`RuntimeConfig` (so a
field the runtime would refuse fails here, in the bench, naming the field), and this module
writes it, starts the server on a free loopback port and waits for ``/ready``.

``runtime`` (``--ab`` in ``bench/runtime/h200.sh``): the directory of *another* revision's
``runtime/`` package to serve instead of this tree's, so two revisions are measured by the same
client in the same lease. Its config carries only the fields the benchmark set (so an older
revision, whose model lacks newer fields, reads it with its own defaults for the rest).
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def runtime_config(settings: dict[str, Any]):
    """``settings`` (the YAML's shape) validated by the runtime's ``RuntimeConfig``; raises on any bad field."""
    from chattts_runtime.config import RuntimeConfig  # noqa: PLC0415  (the bench imports torch lazily too)

    return RuntimeConfig.model_validate(settings)


def config_text(settings: dict[str, Any], *, only_set: bool = False) -> str:
    """The YAML the server reads: the whole validated config, or (``only_set``) just the fields set."""
    config = runtime_config(settings)
    if only_set:
        return yaml.safe_dump(config.model_dump(mode="json", exclude_unset=True), sort_keys=True)
    return config.to_yaml()


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    log: Path

    def stop(self, timeout: float = 60) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


_FIELDS_SCRIPT = """
import json
from pydantic import BaseModel
from chattts_runtime.config import RuntimeConfig

def tree(model):
    out = {}
    for name, info in model.model_fields.items():
        kind = info.annotation
        out[name] = tree(kind) if isinstance(kind, type) and issubclass(kind, BaseModel) else None
    return out

print(json.dumps(tree(RuntimeConfig)))
"""


def _first_on_path(runtime: Path) -> str:
    """PYTHONPATH with ``runtime`` first and the rest kept (the carried wheels on the GPU machine)."""
    return os.pathsep.join([str(Path(runtime).resolve()), *filter(None, [os.environ.get("PYTHONPATH")])])


def known_fields(runtime: Path) -> dict:
    """The config fields another revision's runtime knows, as a tree ({section: {field: None}})."""
    environ = {**os.environ, "PYTHONPATH": _first_on_path(runtime)}
    out = subprocess.run([sys.executable, "-c", _FIELDS_SCRIPT], capture_output=True, text=True, env=environ,
                         cwd=REPO, check=True)
    return json.loads(out.stdout)


_CHECKPOINT_SCRIPT = """
import sys
from pathlib import Path
from chattts_runtime import testing
size, path = sys.argv[1], Path(sys.argv[2])
if not (path / "asset" / "gpt" / "config.json").exists():
    sizes = testing.full_sizes() if size == "full" else testing.tiny_sizes(*map(int, sys.argv[3:6]))
    testing.make_checkpoint(path, sizes, seed=0, endless=True)
"""


def checkpoint_for(runtime: Path, size: str, dims: tuple[int, int, int] | None, path: Path) -> Path:
    """The benchmark's random checkpoint as another revision's runtime writes it (its own layout: a
    checkpoint this tree writes may hold parts an older runtime refuses). Same sizes, seed 0, endless."""
    environ = {**os.environ, "PYTHONPATH": _first_on_path(runtime)}
    subprocess.run([sys.executable, "-c", _CHECKPOINT_SCRIPT, size, str(path), *map(str, dims or ())],
                   env=environ, cwd=REPO, check=True)
    return path


def prune(data: dict, known: dict, prefix: str = "") -> tuple[dict, list[str]]:
    """``data`` without the keys ``known`` lacks, and the dotted names of those left out."""
    kept, dropped = {}, []
    for key, value in data.items():
        if key not in known:
            dropped.append(prefix + key)
        elif isinstance(value, dict) and isinstance(known[key], dict):
            kept[key], more = prune(value, known[key], f"{prefix}{key}.")
            dropped += more
        else:
            kept[key] = value
    return kept, dropped


def start(settings: dict[str, Any], log: Path, *, runtime: Path | None = None,
          env: dict[str, str] | None = None) -> Server:
    """Start a server for ``settings`` (host and port are chosen here); its output goes to ``log``.

    With ``runtime``, the fields that revision's config does not know are left out (an older runtime
    lacks newer fields: refine-text or the text front-end did not exist there) and named in the YAML."""
    port = free_port()
    settings = {**settings, "server": {**settings.get("server", {}), "host": "127.0.0.1", "port": port}}
    log.parent.mkdir(parents=True, exist_ok=True)
    cfg_path = log.with_suffix(".yaml")
    if runtime is None:
        cfg_path.write_text(config_text(settings))
    else:
        data = yaml.safe_load(config_text(settings, only_set=True))
        data, dropped = prune(data, known_fields(runtime))
        note = f"# left out (unknown to {runtime}): {', '.join(dropped)}\n" if dropped else ""
        cfg_path.write_text(note + yaml.safe_dump(data, sort_keys=True))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CHATTTS_")}
    environ.update(env or {})
    if runtime is not None:  # that revision's package first on the path
        environ["PYTHONPATH"] = os.pathsep.join([str(Path(runtime).resolve()),
                                                 *filter(None, [environ.get("PYTHONPATH")])])
    proc = subprocess.Popen([sys.executable, "-m", "chattts_runtime", "serve", "--config", str(cfg_path)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=environ, cwd=REPO)
    return Server(proc, f"http://127.0.0.1:{port}", log)


def log_tail(log: Path | None, lines: int = 20) -> str:
    if log is None or not log.exists():
        return ""
    return "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


async def wait_ready(url: str, proc, timeout: float = 600, log: Path | None = None) -> None:
    import httpx  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}; end of {log}:{log_tail(log)}")
            try:
                if (await client.get(url + "/ready", timeout=2)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)
    raise RuntimeError(f"server did not become ready in {timeout:.0f} s; end of {log}:{log_tail(log)}")
