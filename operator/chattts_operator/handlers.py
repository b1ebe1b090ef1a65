"""kopf's entry points, one line each: every decision and every request is in a controller,
wired by ``app.py``. ``kopf run -m chattts_operator.handlers`` runs the operator too.

ChatTTSDeployments are handled level-based from the stateless ``track_object`` event handler
(no create/update/resume handlers: those are diff-based and patch kopf's diff-base
annotation onto every object at every change). kopf's own state (the GPUSharePolicy
daemon's and delete handler's progress, their finalizer) lives under ``chattts.io/``;
handler names are persisted there: keep them.
"""
from __future__ import annotations

from typing import Any

import kopf

from chattts_operator import app


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    memo.app = await app.start(settings, getattr(memo, "watch_namespaces", None))


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    if getattr(memo, "app", None) is not None:
        await memo.app.stop()


@kopf.on.event(*app.CHATTTS_DEPLOYMENTS)
async def track_object(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    memo.app.observe(event)


@kopf.on.event(*app.CHATTTS_DEPLOYMENTS, labels={app.SHARE_POLICY_LABEL: kopf.PRESENT})
async def member_ctd_changed(labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    memo.app.share_policies.wake(labels.get(app.SHARE_POLICY_LABEL))


@kopf.on.event("batch", "v1", "jobs", labels={app.SHARE_POLICY_LABEL: kopf.PRESENT})
async def member_job_changed(labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    memo.app.share_policies.wake(labels.get(app.SHARE_POLICY_LABEL))


@kopf.on.event(*app.SHARE_POLICIES)
async def policy_changed(type: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    memo.app.share_policy_changed(type, name, dict(body))


@kopf.on.event("", "v1", "nodes")
async def node_changed(type: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    memo.app.share_policies.node_changed(type, name, dict(body))


@kopf.on.event(*app.CHATTTS_DEPLOYMENTS, annotations={app.REPLICA_CAP_ANNOTATION: kopf.PRESENT})
async def capped_ctd_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await memo.app.share_policies.capped_member_changed(dict(body))


@kopf.on.delete(*app.SHARE_POLICIES, id="release-members")
async def policy_deleted(name: str, memo: kopf.Memo, **_: Any) -> None:
    await memo.app.share_policies.policy_deleted(name)


@kopf.daemon(*app.SHARE_POLICIES, id="share-policy", cancellation_timeout=10.0)
async def share_policy_daemon(name: str, memo: kopf.Memo, **_: Any) -> None:
    await memo.app.share_policies.run_policy(name)


@kopf.on.probe(id="resync")
def resync_probe(memo: kopf.Memo, **_: Any) -> float | None:
    return memo.app.deployments.probe() if getattr(memo, "app", None) is not None else None


@kopf.on.probe(id="autoscaler")
def autoscaler_probe(memo: kopf.Memo, **_: Any) -> float | None:
    return memo.app.autoscaler.probe() if getattr(memo, "app", None) is not None else None
