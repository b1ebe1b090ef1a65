"""kopf handlers of the core: ChatTTSDeployment -> children, status, events.

Thin on purpose: every handler hands the object to ``Controller`` (controller.py), which
decides with pure functions (reconcile.py) and does the reads and writes.

- create / update / resume of a ChatTTSDeployment: reconcile it now.
- every watch event of a ChatTTSDeployment: remember the latest object (the resync loop
  and Deployment events reconcile from it, without reading it again).
- watch events of the Deployments we manage (label-selected): refresh status when pods
  become ready, and put back a hand edit or a deleted Deployment at once.
- a resync loop (a task, not a kopf timer: kopf timers need a finalizer on every object,
  and we want none: owner references collect the children) reconciles every object each
  ``resync_interval_seconds``.

kopf's own state lives in annotations under ``chattts.io/`` (progress and the diff base of
the last handled spec); the finalizer name is set too, although nothing here needs one.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import kopf
from kubernetes_asyncio.client.exceptions import ApiException

from chattts_operator import metrics
from chattts_operator.api.chattts import GROUP, PLURAL, VERSION
from chattts_operator.builders import LABEL_MANAGED_BY, MANAGED_BY
from chattts_operator.controller import Controller, copy_body, owner_key
from chattts_operator.kube import Kube, make_api_client
from chattts_operator.settings import OperatorSettings

PERSISTENCE_PREFIX = "chattts.io"
log = logging.getLogger("chattts_operator")


def configure_kopf(settings: kopf.OperatorSettings) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PERSISTENCE_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PERSISTENCE_PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{PERSISTENCE_PREFIX}/finalizer"
    # kopf would post an Event per handler run; the controller posts its own on transitions.
    settings.posting.level = logging.WARNING


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    configure_kopf(settings)
    operator_settings = OperatorSettings.from_env()
    kube = Kube(await make_api_client())
    controller = Controller(kube, operator_settings)
    memo.controller = controller
    memo.started_at = time.time()
    memo.resync_task = asyncio.create_task(controller.resync_forever(), name="chattts-resync")
    # Port 0 picks a free port (tests run several operators in one process).
    server, _thread = metrics.serve(operator_settings.metrics_port)
    memo.metrics_server = server
    log.info("operator metrics on :%d/metrics", server.server_port)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    task = getattr(memo, "resync_task", None)
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    controller: Controller | None = getattr(memo, "controller", None)
    if controller is not None:
        await controller.kube.close()
    server = getattr(memo, "metrics_server", None)
    if server is not None:
        server.shutdown()
        server.server_close()


async def _reconcile(body: kopf.Body, memo: kopf.Memo, trigger: str) -> None:
    try:
        await memo.controller.reconcile_body(copy_body(body), trigger)
    except ApiException as err:
        raise kopf.TemporaryError(f"Kubernetes API error {err.status} {err.reason}", delay=5) from err


@kopf.on.create(GROUP, VERSION, PLURAL)
async def on_create(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await _reconcile(body, memo, "create")


@kopf.on.update(GROUP, VERSION, PLURAL)
async def on_update(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await _reconcile(body, memo, "update")


@kopf.on.resume(GROUP, VERSION, PLURAL)
async def on_resume(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await _reconcile(body, memo, "resume")


@kopf.on.event(GROUP, VERSION, PLURAL)
async def track_object(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    obj = event.get("object")
    if isinstance(obj, dict) and obj.get("metadata"):
        memo.controller.observe(copy_body(obj), deleted=event.get("type") == "DELETED")


@kopf.on.event("apps", "v1", "deployments", labels={LABEL_MANAGED_BY: MANAGED_BY})
async def child_deployment_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    obj = event.get("object")
    if not isinstance(obj, dict):
        return
    key = owner_key(obj)
    if key is None:
        return
    deleted = event.get("type") == "DELETED"
    try:
        # A deleted Deployment is recreated by a full reconcile; otherwise the event's
        # object is the live Deployment (no need to read it again).
        await memo.controller.reconcile_key(key, "deployment-deleted" if deleted else "deployment",
                                            live_deployment=None if deleted else copy_body(obj),
                                            deployment_deleted=deleted)
    except ApiException as err:
        log.warning("reconcile of %s/%s after a Deployment event failed: %s %s (the resync will retry)",
                    *key, err.status, err.reason)


@kopf.on.probe(id="resync")
def resync_probe(memo: kopf.Memo, **_: Any) -> float | None:
    """Seconds since the last full resync pass; the liveness endpoint fails (500) when the
    loop has died or is more than three intervals late."""
    controller: Controller | None = getattr(memo, "controller", None)
    if controller is None:
        return None
    task = getattr(memo, "resync_task", None)
    if task is not None and task.done():
        raise RuntimeError("the resync loop has stopped")
    since = controller.last_resync or memo.started_at
    age = time.time() - since
    if age > 3 * controller.settings.resync_interval_seconds + 60:
        raise RuntimeError(f"no resync pass for {age:.0f}s")
    return round(age, 1)
