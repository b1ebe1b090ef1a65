"""bench/runtime/vllm_prepare.sh and vllm_h200.sh on the CPU: pieces, hashes, reassembly, arguments, and
every step's command line parsed by its module (--smoke), so a typo fails here and not on the GPU."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PREPARE = REPO / "bench" / "runtime" / "vllm_prepare.sh"
H200 = REPO / "bench" / "runtime" / "vllm_h200.sh"
REQS = REPO / "bench" / "runtime" / "vllm_h200.requirements.txt"


def run(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **env}
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env=environ, cwd=REPO,
                          timeout=300)


def pins() -> list[tuple[str, str]]:
    lines = (re.sub(r"#.*", "", line).strip() for line in REQS.read_text().splitlines())
    return [tuple(line.split("==")) for line in lines if line]


@pytest.fixture()
def prepared(tmp_path) -> Path:
    """Stand-in wheels for every pin (random bytes, 3.5 MiB in all), cut into 1 MiB pieces."""
    wheels = tmp_path / ".vllm" / "wheels"
    wheels.mkdir(parents=True)
    for i, (name, version) in enumerate(pins()):
        norm = re.sub(r"[-_.]+", "_", name.lower())
        (wheels / f"{norm}-{version}-py3-none-any.whl").write_bytes(os.urandom(3_500_000 if i == 0 else 1000))
    (wheels / "vllm-0.25.0-py3-none-any.whl").write_bytes(b"an older download: not in the bundle")
    out = run(PREPARE, "--offline", VLLM_DIR=str(tmp_path / ".vllm"), PIECE_MIB="1")
    assert out.returncode == 0, out.stderr
    assert "4 pieces of at most 1 MiB" in out.stdout
    return tmp_path / ".vllm"


def test_prepare_cuts_pieces_whose_hashes_and_concatenation_check(prepared):
    pieces = sorted(prepared.glob("pieces/p[0-9][0-9]"))
    assert [p.name for p in pieces] == ["p00", "p01", "p02", "p03"]
    assert all(p.stat().st_size == 1 << 20 for p in pieces[:-1])
    sums = dict(reversed(line.split()) for line in (prepared / "pieces" / "SHA256SUMS").read_text().splitlines())
    for piece in pieces:
        assert sums[piece.name] == hashlib.sha256(piece.read_bytes()).hexdigest()
    bundle = b"".join(p.read_bytes() for p in pieces)
    assert sums["bundle.tar"] == hashlib.sha256(bundle).hexdigest()
    listing = subprocess.run(["tar", "-t"], input=bundle, capture_output=True, check=True).stdout.decode().split()
    assert len(listing) == len(pins()) and "vllm-0.26.0-py3-none-any.whl" in listing
    assert "vllm-0.25.0-py3-none-any.whl" not in listing


def test_the_runbook_names_one_call_per_piece_the_last_one_measuring(prepared):
    out = run(PREPARE, "--offline", VLLM_DIR=str(prepared), PIECE_MIB="1")
    calls = [line for line in out.stdout.splitlines() if line.strip().startswith("call ")]
    assert len(calls) == 4
    assert 'vllm_h200.sh piece p00' in calls[0] and '".vllm/pieces/p00", ".vllm/pieces/SHA256SUMS"' in calls[0]
    assert 'vllm_h200.sh run' in calls[-1] and '".vllm/pieces/p03"' in calls[-1]


def test_device_side_takes_pieces_checks_hashes_and_names_what_is_missing(prepared, tmp_path):
    device = tmp_path / "device-pieces"
    env = {"VLLM_DIR": str(prepared), "PIECES": str(device), "OUT": str(tmp_path / "out")}
    for name in ("p00", "p01"):
        out = run(H200, "piece", name, **env)
        assert out.returncode == 0, out.stderr
        assert (device / name).read_bytes() == (prepared / "pieces" / name).read_bytes()
    # The last call finds p02 missing (the machine was given back between calls): said, not guessed.
    (prepared / "pieces" / "p02").rename(tmp_path / "p02")
    out = run(H200, "run", "--steps", "imports", **env)
    assert out.returncode == 1 and "lacks: p02" in out.stderr
    # A piece damaged in transfer is refused on arrival.
    damaged = bytearray((tmp_path / "p02").read_bytes())
    damaged[100] ^= 0xFF
    (prepared / "pieces" / "p02").write_bytes(bytes(damaged))
    out = run(H200, "piece", "p02", **env)
    assert out.returncode == 1 and "piece p02: sha256" in out.stderr and not (device / "p02").exists()


@pytest.mark.parametrize("args, message", [
    (("piece", "p1"), "named pNN"), (("piece", "p77"), "not in"), (("run", "--steps", "nope"), "unknown step"),
    (("run", "--budget", "x"), "whole seconds"), (("bogus",), "unknown mode"),
])
def test_bad_arguments_are_refused_before_anything_runs(args, message, tmp_path):
    out = run(H200, *args, VLLM_DIR=str(tmp_path / ".vllm"), PIECES=str(tmp_path / "p"), OUT=str(tmp_path / "out"))
    assert out.returncode == 2 and message in out.stderr


def test_smoke_parses_every_steps_command_line(tmp_path):
    known = re.search(r'^KNOWN_STEPS="([^"]+)"', H200.read_text(), re.M).group(1).split()
    assert {"vllm_profile", "check_control", "anchor"} <= set(known)
    out = run(H200, "--smoke", "--steps", " ".join(known), OUT=str(tmp_path / "out"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    summary = (tmp_path / "out" / "summary.txt").read_text()
    for step in known:
        assert re.search(rf"^{step}: passed", summary, re.M), summary
    # A level the benchmark refuses fails the smoke (exit 2 of its parser), as it would on the GPU.
    out = run(H200, "--smoke", "--steps", "vllm", "--levels", "1,x", OUT=str(tmp_path / "out2"))
    assert out.returncode == 1 and "vllm: FAILED (exit 2)" in (tmp_path / "out2" / "summary.txt").read_text()
