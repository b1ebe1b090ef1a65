"""The operator assembled: settings read once, one Kubernetes client, the three feature
controllers wired to each other explicitly. ``handlers.py`` only forwards kopf's calls here.

    deployments     (deployment/)   ChatTTSDeployment -> children, status, events
    share_policies  (sharepolicy/)  GPUSharePolicy -> Job suspends, replica caps
    autoscaler      (autoscaling/)  scale subresource; hands tuned specs to ``deployments``
"""
from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from dataclasses import dataclass
from typing import Any, Mapping

import kopf

from chattts_operator.api import chattts, sharepolicy
from chattts_operator.autoscaling.controller import Autoscaler
from chattts_operator.core import clock, metrics
from chattts_operator.core.heap import HeapCollector
from chattts_operator.core.kube import Kube, make_api_client
from chattts_operator.core.podhttp import PodHttp
from chattts_operator.core.labels import PERSISTENCE_PREFIX
from chattts_operator.core.settings import OperatorSettings
from chattts_operator.deployment.controller import DeploymentController
from chattts_operator.quantization.controller import QuantizationReconciler
from chattts_operator.sharepolicy.controller import SharePolicyController

# What handlers.py subscribes to (it imports nothing else of ours).
CHATTTS_DEPLOYMENTS = (chattts.GROUP, chattts.VERSION, chattts.PLURAL)
SHARE_POLICIES = (sharepolicy.GROUP, sharepolicy.VERSION, sharepolicy.PLURAL)
SHARE_POLICY_LABEL = sharepolicy.SHARE_POLICY_LABEL
REPLICA_CAP_ANNOTATION = sharepolicy.REPLICA_CAP_ANNOTATION

log = logging.getLogger("chattts_operator")


def configure_kopf(settings: kopf.OperatorSettings) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PERSISTENCE_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PERSISTENCE_PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{PERSISTENCE_PREFIX}/finalizer"
    # kopf would post an Event per handler run; the controllers post their own on transitions.
    settings.posting.level = logging.WARNING


@dataclass
class App:
    settings: OperatorSettings
    kube: Kube
    deployments: DeploymentController
    share_policies: SharePolicyController
    autoscaler: Autoscaler
    pod_http: PodHttp | None = None  # the one client of the pods' endpoints (both controllers')
    metrics_server: Any = None
    loop_lag: asyncio.Task | None = None  # core/metrics.py watch_loop_lag
    heap: HeapCollector | None = None
    heap_task: asyncio.Task | None = None

    def observe(self, event: Mapping[str, Any]) -> None:
        """Every watch event of a ChatTTSDeployment: the latest object, for the resync loop,
        child events and the autoscaler (none of them reads it again); the deployment
        controller reconciles it when it is new or asks for something new."""
        obj = event.get("object")
        if isinstance(obj, dict) and obj.get("metadata"):
            deleted = event.get("type") == "DELETED"
            # The deployment controller only reads its bodies, and kopf never changes an event's
            # object once parsed: it takes kopf's own (a deep copy per event was ~3% of the
            # operator's CPU at 1,000 objects). The autoscaler writes its decision into its copy.
            self.deployments.observe_event(event.get("type"), obj)
            self.autoscaler.observe(copy.deepcopy(obj), deleted=deleted)

    def share_policy_changed(self, event_type: str | None, name: str, body: Mapping[str, Any]) -> None:
        """A GPUSharePolicy's watch event: its loop and the others re-plan; the ChatTTSDeployments
        labelled with its name learn whether it exists (their SharePolicy condition)."""
        self.share_policies.policy_changed(event_type, name, body)
        self.deployments.share_policy_changed(name, exists=event_type != "DELETED")

    async def stop(self) -> None:
        for task in (self.loop_lag, self.heap_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.heap is not None:
            self.heap.uninstall()
        await self.autoscaler.stop()
        await self.deployments.stop()
        if self.pod_http is not None:
            await self.pod_http.close()
        await self.kube.close()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()


async def start(kopf_settings: kopf.OperatorSettings, namespaces: tuple[str, ...] | list[str] | None = None,
                settings: OperatorSettings | None = None) -> App:
    """Build and start everything. ``namespaces``: what the CLI gave kopf; under
    ``kopf run -m`` (None) the settings decide."""
    configure_kopf(kopf_settings)
    settings = settings or OperatorSettings.from_env()
    kube = Kube(await make_api_client())
    pod_http = PodHttp(settings.autoscaler.metrics_url_annotation)
    deployments = DeploymentController(kube, settings, QuantizationReconciler(kube, settings), http=pod_http)
    app = App(
        settings=settings,
        kube=kube,
        deployments=deployments,
        share_policies=SharePolicyController(kube, settings, clock=clock.now),
        autoscaler=Autoscaler(kube, settings, on_tuned=deployments.roll_out_tuned, http=pod_http),
        pod_http=pod_http,
    )
    deployments.start(tuple(namespaces or settings.watch_namespaces))
    app.autoscaler.start()
    await app.share_policies.ensure_priority_classes()
    # Port 0 picks a free port (tests run several operators in one process).
    server, _thread = metrics.serve(settings.metrics_port)
    app.metrics_server = server
    app.loop_lag = asyncio.create_task(metrics.watch_loop_lag(), name="chattts-loop-lag")
    app.heap = HeapCollector(settings.gc_freeze_survivors, settings.gc_thaw_seconds)
    app.heap.install()
    app.heap_task = asyncio.create_task(app.heap.run(), name="chattts-heap")
    log.info("operator metrics on :%d/metrics", server.server_port)
    return app
