"""What building one desired state costs, and the runtime config's YAML emitter's share of it:
``python -m bench.operator_desired_state`` (medians of 7 rounds of 200, both emitters in the same run)."""
from __future__ import annotations

import statistics
import time

import yaml

from bench.operator_scale.workload import LARGEST_GPU_MIB, chattts_deployment
from chattts_operator.core.settings import OperatorSettings
from chattts_operator.deployment.spec import desired_state, parse_spec
from chattts_runtime import config as runtime_config


def median_ms(work, rounds: int = 7, per_round: int = 200) -> float:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(per_round):
            work()
        samples.append((time.perf_counter() - started) / per_round * 1e3)
    return statistics.median(samples)


def main() -> None:
    body = chattts_deployment("tts-0001", "bench")
    body["metadata"].update(uid="bench-uid", generation=2)
    spec, settings = parse_spec(body), OperatorSettings()
    rows = {}
    for label, dumper in (("pure-Python emitter (SafeDumper)", yaml.SafeDumper),
                          ("libyaml emitter (CSafeDumper)", getattr(yaml, "CSafeDumper", None))):
        if dumper is None:
            continue
        runtime_config._YAML_DUMPER = dumper
        rows[label] = median_ms(lambda: desired_state(body, spec, settings, largest_node_gpu_mib=LARGEST_GPU_MIB))
    baseline = next(iter(rows.values()))
    print("| runtime config emitter | desired state (ms, median) | ratio |\n|---|---|---|")
    for label, ms in rows.items():
        print(f"| {label} | {ms:.2f} | {ms / baseline:.2f} |")


if __name__ == "__main__":
    main()
