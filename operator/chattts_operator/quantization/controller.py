"""The quantization feature's step of a ChatTTSDeployment's reconcile: create the AWQ Job once,
delete Jobs of an older spec, and say which weights the serving pods mount (the decisions are
``plan.py``'s, pure). ``app.py`` hands an instance to the deployment controller, which calls it on
every pass; this module may read the deployment's GPU assignment and child builders (below it)."""
from __future__ import annotations

from typing import Any

from chattts_operator.api.chattts import ChatTTSDeploymentSpec
from chattts_operator.core import metrics
from chattts_operator.core.kube import Kube
from chattts_operator.core.settings import OperatorSettings
from chattts_operator.deployment.children import Owner, build_resource_claim_template, event_subject
from chattts_operator.deployment.gpu import DraRequest, GpuAssignmentError, assign_gpu, node_affinity
from chattts_operator.deployment.spec import needs_apply
from chattts_operator.quantization.plan import COMPONENT, JobPlacement, QuantizationPlan, job_selector, labels_for, plan_quantization



class QuantizationReconciler:
    """Called as ``await step(body, spec, previous_status)``; its writes are the Job (create once,
    delete stale ones), the dra profile's claim template for the Job's pod, and Events."""

    def __init__(self, kube: Kube, settings: OperatorSettings) -> None:
        self.kube = kube
        self.settings = settings

    async def __call__(self, body: dict[str, Any], spec: ChatTTSDeploymentSpec,
                       previous_status: dict[str, Any]) -> QuantizationPlan | None:
        """Create the quantization Job once, delete Jobs of an older spec, and decide which
        weights the pods mount. None when quantization was never asked for."""
        meta = body["metadata"]
        if spec.quantization is None and previous_status.get("quantization") is None:
            return None  # never asked for (status records it while a Job may exist): no Jobs LIST
        jobs = await self.kube.list_namespaced("Job", meta["namespace"], job_selector(meta["name"]))
        if spec.quantization is None and not jobs and previous_status.get("quantization") is None:
            return None
        gpu_spec = spec.gpu
        if spec.quantization is not None and spec.quantization.gpu_memory:
            gpu_spec = gpu_spec.model_copy(update={"memory": spec.quantization.gpu_memory})
        claim_template = None
        try:
            gpu = assign_gpu(gpu_spec, self.settings)
            limits, affinity, selector = gpu.limits, node_affinity(gpu, self.settings), gpu.node_selector
        except GpuAssignmentError:
            limits, affinity, selector = {}, None, {}
        else:
            if gpu.dra is not None and spec.quantization is not None:
                claim_template = await self._apply_claim_template(meta, gpu.dra)
        tolerations = []
        if self.settings.gpu_toleration_key:
            tolerations.append({"key": self.settings.gpu_toleration_key, "operator": "Exists", "effect": "NoSchedule"})
        tolerations += [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
        plan = plan_quantization(
            ctd_name=meta["name"], namespace=meta["namespace"], owner_uid=meta["uid"], spec=body.get("spec") or {},
            jobs=jobs, previous=previous_status.get("quantization"),
            placement=JobPlacement(
                image=spec.image or self.settings.runtime_image, image_pull_policy=self.settings.runtime_image_pull_policy,
                gpu_limits=limits, tolerations=tolerations, node_affinity=(affinity or {}).get("nodeAffinity"),
                node_selector=selector, gpu_claim_template=claim_template),
            generation=int(meta.get("generation") or 1),
        )
        if plan.job_to_create is not None:
            await self.kube.create(plan.job_to_create)
        for name in plan.stale_jobs:
            await self.kube.delete("Job", meta["namespace"], name)
        for event_type, reason, message in plan.events:
            await self.kube.post_event(event_subject(body), event_type, reason, message)
        return plan

    async def _apply_claim_template(self, meta: dict[str, Any], dra: DraRequest) -> str:
        """The dra profile's template for the quantization Job's pod (its own name and labels:
        its claims are not the serving pods'); applied when missing or changed."""
        owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
        template = build_resource_claim_template(owner, dra, purpose=COMPONENT,
                                                 labels=labels_for(meta["name"]))
        name = template["metadata"]["name"]
        if needs_apply(template, await self.kube.get("ResourceClaimTemplate", owner.namespace, name)):
            await self.kube.apply(template)
            metrics.CHILD_WRITES.labels("ResourceClaimTemplate").inc()
        return name
