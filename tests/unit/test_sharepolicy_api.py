"""GPUSharePolicy spec validation: bad input is rejected with a message that says what to fix."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from chattts_operator.api.sharepolicy import GPUSharePolicySpec, parse_clock_time

GOOD_WINDOW = {"name": "day", "start": "08:00", "end": "20:00", "online": 80, "offline": 20}


def make(**overrides):
    body = {"nodeSelector": {"matchLabels": {"pool": "tts"}}, "timezone": "Europe/Berlin", "windows": [GOOD_WINDOW]}
    body.update(overrides)
    return GPUSharePolicySpec.model_validate(body)


def test_a_good_spec():
    spec = make()
    assert spec.windows[0].shares.online == 80
    assert spec.default_shares.online == 100 and spec.default_shares.offline == 0
    assert spec.overlap.value == "LatestStart"


BAD = [
    ("unknown timezone", {"timezone": "Mars/Olympus"}, "unknown timezone"),
    ("timezone with spaces", {"timezone": "Europe Berlin"}, "timezone"),
    ("shares above 100", {"windows": [{**GOOD_WINDOW, "offline": 30}]}, "may not exceed 100"),
    ("negative share", {"windows": [{**GOOD_WINDOW, "online": -1}]}, "greater than or equal to 0"),
    ("start equals end", {"windows": [{**GOOD_WINDOW, "end": "08:00"}]}, "start and end must differ"),
    ("hour 25", {"windows": [{**GOOD_WINDOW, "start": "25:00"}]}, "pattern"),
    ("single-digit hour", {"windows": [{**GOOD_WINDOW, "start": "8:00"}]}, "pattern"),
    ("start at 24:00", {"windows": [{**GOOD_WINDOW, "start": "24:00", "end": "06:00"}]}, "may not start at 24:00"),
    ("duplicate names", {"windows": [GOOD_WINDOW, {**GOOD_WINDOW, "start": "21:00", "end": "22:00"}]}, "unique"),
    ("unknown weekday", {"windows": [{**GOOD_WINDOW, "days": ["Monday"]}]}, "Mon"),
    ("unknown field", {"windows": [{**GOOD_WINDOW, "share": 3}]}, "Extra inputs"),
    ("bad window name", {"windows": [{**GOOD_WINDOW, "name": "Day Shift"}]}, "pattern"),
    ("default shares above 100", {"defaultShares": {"online": 90, "offline": 20}}, "may not exceed 100"),
    ("unknown overlap rule", {"overlap": "Random"}, "LatestStart"),
    ("In without values", {"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}, "needs values"),
]


@pytest.mark.parametrize("case, overrides, message", BAD, ids=[b[0] for b in BAD])
def test_bad_specs_are_rejected_with_a_clear_message(case, overrides, message):
    with pytest.raises(ValidationError, match=message):
        make(**overrides)


def test_node_selector_is_required():
    with pytest.raises(ValidationError, match="nodeSelector"):
        GPUSharePolicySpec.model_validate({"windows": []})


@pytest.mark.parametrize("text, value", [("00:00", (0, 0)), ("23:59", (23, 59)), ("24:00", (24, 0))])
def test_parse_clock_time(text, value):
    assert parse_clock_time(text) == value


@pytest.mark.parametrize("bad", ["24:01", "7:00", "12:60", "noon", ""])
def test_parse_clock_time_rejects(bad):
    with pytest.raises(ValueError, match="HH:MM"):
        parse_clock_time(bad)


def test_the_examples_are_valid():
    from pathlib import Path

    import yaml

    from chattts_operator.sharepolicy.observe import offline_member

    root = Path(__file__).resolve().parents[2] / "deploy" / "examples"
    policy = yaml.safe_load((root / "gpusharepolicy.yaml").read_text())
    spec = GPUSharePolicySpec.model_validate(policy["spec"])
    assert [w.name for w in spec.windows] == ["day", "night", "launch-peak"]
    job = yaml.safe_load((root / "gpusharepolicy-batch-synthesis-job.yaml").read_text())
    assert job["metadata"]["labels"]["tts.chattts.io/share-policy"] == policy["metadata"]["name"]
    job["metadata"].update(namespace="batch", uid="u")
    member = offline_member(job, [], per_gpu_mib=143_771)
    assert member.suspended and member.per_pod_mib == 16_384 and member.priority == 10


def test_the_quantization_example_is_a_valid_ctd():
    from pathlib import Path

    import yaml

    from chattts_operator.api.chattts import ChatTTSDeploymentSpec

    root = Path(__file__).resolve().parents[2] / "deploy" / "examples"
    ctd = yaml.safe_load((root / "gpusharepolicy-awq-quantization.yaml").read_text())
    spec = ChatTTSDeploymentSpec.model_validate(ctd["spec"])
    assert spec.quantization is not None and spec.quantization.share_policy == "gpu-pool"
    assert ctd["metadata"]["labels"]["tts.chattts.io/share-policy"] == "gpu-pool"
