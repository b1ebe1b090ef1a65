"""kopf handlers of the core: ChatTTSDeployment -> children, status, events.

Thin on purpose: every handler hands the object to ``Controller`` (controller.py), which
decides with pure functions (reconcile.py) and does the reads and writes.

- create / update / resume of a ChatTTSDeployment: reconcile it now.
- every watch event of a ChatTTSDeployment: remember the latest object (the resync loop
  and Deployment events reconcile from it, without reading it again).
- watch events of the Deployments we manage (a list+watch with a server-side label
  selector, watch.py, not kopf: see there why): refresh status when pods become ready,
  and put back a hand edit or a deleted Deployment at once.
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
from chattts_operator.watch import ListWatch

PERSISTENCE_PREFIX = "chattts.io"
MANAGED_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
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
    # The CLI passes the namespaces it gave kopf; under `kopf run -m` the settings decide.
    namespaces = list(getattr(memo, "watch_namespaces", None) or operator_settings.watch_namespaces)
    memo.deployment_watches = [
        ListWatch(kube, path, MANAGED_SELECTOR, _deployment_event_handler(controller))
        for path in ([f"/apis/apps/v1/namespaces/{ns}/deployments" for ns in namespaces]
                     or ["/apis/apps/v1/deployments"])
    ]
    memo.watch_tasks = [asyncio.create_task(w.run_forever(), name=f"chattts-watch {w.path}")
                        for w in memo.deployment_watches]
    # Port 0 picks a free port (tests run several operators in one process).
    server, _thread = metrics.serve(operator_settings.metrics_port)
    memo.metrics_server = server
    log.info("operator metrics on :%d/metrics", server.server_port)


def _deployment_event_handler(controller: Controller):
    """Reconcile the owner of a changed Deployment, in its own task (the watch keeps reading);
    controller.reconcile_key collapses bursts for one object into one run."""
    pending: set[asyncio.Task] = set()

    async def reconcile_owner(key, kind: str, obj: dict[str, Any]) -> None:
        deleted = kind == "DELETED"
        try:
            await controller.reconcile_key(key, "deployment-deleted" if deleted else "deployment",
                                           live_deployment=None if deleted else obj, deployment_deleted=deleted)
        except ApiException as err:
            log.warning("reconcile of %s/%s after a Deployment event failed: %s %s (the resync will retry)",
                        *key, err.status, err.reason)
        except Exception:  # noqa: BLE001 - never lose the watch over one object
            log.exception("reconcile of %s/%s after a Deployment event failed", *key)

    async def on_event(kind: str, obj: dict[str, Any]) -> None:
        key = owner_key(obj)
        if key is None or (kind == "LISTED"):
            return  # listed Deployments are covered by the resume of their owners
        task = asyncio.create_task(reconcile_owner(key, kind, obj))
        pending.add(task)
        task.add_done_callback(pending.discard)

    return on_event


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    tasks = [t for t in [getattr(memo, "resync_task", None), *getattr(memo, "watch_tasks", [])] if t is not None]
    for task in tasks:
        task.cancel()
    for task in tasks:
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


@kopf.on.probe(id="resync")
def resync_probe(memo: kopf.Memo, **_: Any) -> float | None:
    """Seconds since the last full resync pass; the liveness endpoint fails (500) when the
    loop has died or is more than three intervals late."""
    controller: Controller | None = getattr(memo, "controller", None)
    if controller is None:
        return None
    for task in [getattr(memo, "resync_task", None), *getattr(memo, "watch_tasks", [])]:
        if task is not None and task.done():
            raise RuntimeError(f"the task {task.get_name()!r} has stopped")
    since = controller.last_resync or memo.started_at
    age = time.time() - since
    if age > 3 * controller.settings.resync_interval_seconds + 60:
        raise RuntimeError(f"no resync pass for {age:.0f}s")
    return round(age, 1)
