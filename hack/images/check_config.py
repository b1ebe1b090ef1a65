#!/usr/bin/env python3
"""Checks an image's config (`skopeo inspect --config` JSON on stdin) against what the chart
relies on: the non-root user 65532, an entrypoint, exposed ports, HOME=/tmp, OCI labels."""
import json
import sys

name = sys.argv[1]
config = json.load(sys.stdin)["config"]
env = dict(item.split("=", 1) for item in config.get("Env", []))
labels = config.get("Labels") or {}
problems = []
if config.get("User") != "65532:65532":
    problems.append(f"user {config.get('User')!r}, expected 65532:65532")
if not config.get("Entrypoint"):
    problems.append("no entrypoint")
if not config.get("ExposedPorts"):
    problems.append("no exposed ports")
if env.get("HOME") != "/tmp":
    problems.append(f"HOME {env.get('HOME')!r}, expected /tmp")
missing = {"org.opencontainers.image.title", "org.opencontainers.image.version"} - labels.keys()
if missing:
    problems.append(f"labels missing: {sorted(missing)}")
if problems:
    sys.exit(f"[images] {name}: " + "; ".join(problems))
print(f"[images] {name}: user {config['User']}, entrypoint {config['Entrypoint']}, "
      f"ports {sorted(config['ExposedPorts'])}, version {labels['org.opencontainers.image.version']}")
