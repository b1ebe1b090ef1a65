"""The image tier: the images `make images` built (hack/images/build.sh), run with podman.

Containers run as CI runs them on a cluster: read-only root filesystem, non-root, every
capability dropped, no new privileges, a tmpfs at /tmp (the chart's emptyDir). They share the
host's network and talk to loopback only (the local control plane, the test's HTTP client).
Without podman or the images the tier is skipped, unless CHATTTS_REQUIRE_IMAGES is set (CI).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest
from bench.runtime.launch import free_port  # noqa: F401  (one port picker for tests and benches)

REPO = Path(__file__).resolve().parents[2]
VERSION = re.search(r'^version = "(.+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
OPERATOR_IMAGE = f"localhost/chattts-operator:{VERSION}"
RUNTIME_CPU_IMAGE = f"localhost/chattts-runtime:{VERSION}-cpu"
# The flags every smoke container runs with: what the chart's securityContext asks for.
LOCKED_DOWN = ["--network=host", "--read-only", "--cap-drop=all", "--security-opt=no-new-privileges",
               "--user=65532:65532", "--tmpfs=/tmp:rw,size=256m,mode=1777"]




def podman_command(*args: str) -> list[str]:
    """podman with the project's storage and containers.conf (hack/images/env.sh)."""
    return ["bash", "-c", 'source "$0/hack/images/env.sh" && exec podman "$@"', str(REPO), *args]


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    result = subprocess.run(podman_command(*args), capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def _require(image: str) -> str:
    problem = None
    if shutil.which("podman") is None:
        problem = "podman missing: run hack/images/setup-tools.sh"
    elif podman("image", "exists", image, check=False).returncode != 0:
        problem = f"{image} not built: run make images"
    if problem:
        if os.environ.get("CHATTTS_REQUIRE_IMAGES"):
            pytest.fail(problem)
        pytest.skip(problem)
    return image


@pytest.fixture(scope="session")
def operator_image() -> str:
    return _require(OPERATOR_IMAGE)


@pytest.fixture(scope="session")
def runtime_cpu_image() -> str:
    return _require(RUNTIME_CPU_IMAGE)


@dataclass
class Container:
    name: str

    def logs(self) -> str:
        result = podman("logs", self.name, check=False)
        return result.stdout + result.stderr

    def running(self) -> bool:
        state = podman("inspect", "--format", "{{.State.Running}}", self.name, check=False)
        return state.stdout.strip() == "true"


@pytest.fixture
def run_container(request: pytest.FixtureRequest) -> Iterator[Callable[..., Container]]:
    """run_container(image, *args, options=[...]): a detached, locked-down container, removed
    after the test; its log is printed when the test fails."""
    started: list[Container] = []

    def run(image: str, *args: str, options: list[str] = ()) -> Container:
        name = f"chattts-test-{os.getpid()}-{len(started)}-{int(time.time())}"
        podman("run", "--detach", "--name", name, *LOCKED_DOWN, *options, image, *args)
        container = Container(name)
        started.append(container)
        return container

    yield run
    for container in started:
        print(f"--- log of {container.name}\n{container.logs()[-6000:]}")
        podman("rm", "--force", "--time=5", container.name, check=False)


def wait_for_http(url: str, container: Container, timeout: float = 180) -> bytes:
    """GET url until it answers 200; fails early (with the log) when the container exits."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read()
        except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
            last = str(error)
        if not container.running():
            raise AssertionError(f"{container.name} exited before {url} answered:\n{container.logs()[-4000:]}")
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {timeout:.0f} s ({last}):\n{container.logs()[-4000:]}")
