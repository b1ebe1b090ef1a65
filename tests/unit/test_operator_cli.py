"""The chattts-operator command line (what runs before kopf starts)."""
from __future__ import annotations

import yaml

from chattts_operator import cli
from chattts_operator.core.settings import OperatorSettings


def test_crds_subcommand_prints_every_crd(capsys):
    assert cli.main(["crds"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert {d["metadata"]["name"] for d in docs} >= {"chattsdeployments.tts.chattts.io"}


def test_bad_setting_stops_before_connecting(capsys, monkeypatch):
    monkeypatch.setenv("CHATTTS_OPERATOR_GPU_PROFILE", "vgpu")
    assert cli.main(["run", "--all-namespaces"]) == 2
    assert "CHATTTS_OPERATOR_GPU_PROFILE" in capsys.readouterr().err


def test_arguments_match_the_chart():
    args = cli.build_parser().parse_args(["run", "--liveness=http://0.0.0.0:8080/healthz", "--namespace=a",
                                          "--namespace=b"])
    assert args.namespace == ["a", "b"] and args.liveness == "http://0.0.0.0:8080/healthz"
    assert cli.build_parser().parse_args(["run", "--all-namespaces"]).all_namespaces


def test_the_operator_runs_on_uvloop_unless_told_otherwise(capsys, monkeypatch):
    import uvloop  # noqa: PLC0415 - an operator dependency since #19d

    assert OperatorSettings().event_loop == "uvloop"
    assert cli.loop_factory("uvloop") is uvloop.new_event_loop
    assert cli.loop_factory("asyncio") is None  # asyncio.Runner's own default loop
    monkeypatch.setenv("CHATTTS_OPERATOR_EVENT_LOOP", "trio")
    assert cli.main(["run", "--all-namespaces"]) == 2
    assert "CHATTTS_OPERATOR_EVENT_LOOP" in capsys.readouterr().err
