"""Admission: the queue's quota (nominal + borrowing from its cohort), per resource and per GPU model.

A job that could fit under several GPU models keeps only the models its queue still has quota for;
the filters then see only GPUs of those models.
"""

from __future__ import annotations

from typing import ClassVar

from gpufleet.domain.quotas import CPU, GPU, MEMORY, gpu_model_key
from gpufleet.scheduling.plugin_api import SUCCESS, ClusterView, Code, JobView, QuotaVerdict, Status, Wake

NAME = "quota"


def _status(verdicts: list[QuotaVerdict]) -> Status:
    code = Code.UNRESOLVABLE if all(not v.ever for v in verdicts) else Code.UNSCHEDULABLE
    wake = Wake.CLUSTER_CHANGE if code is Code.UNRESOLVABLE else Wake.QUOTA
    return Status(code, tuple(dict.fromkeys(v.reason for v in verdicts)), NAME, wake)


class QuotaAdmission:
    name: ClassVar[str] = NAME
    # Less usage never fails a limit (queue, cohort pool, per model) that more usage passed: monotone.
    monotone: ClassVar[bool] = True
    checks_quota: ClassVar[bool] = True

    def admit(self, view: JobView, cluster: ClusterView) -> Status:
        job = view.job
        ledger = cluster.quotas
        spec = ledger.queues.get(job.queue)
        if spec is None or not spec.quotas:
            return SUCCESS
        request = job.request
        n = job.gang_size
        quotas = spec.quotas
        failed: list[QuotaVerdict] = []
        for key, amount in (
            (GPU, request.gpu_milli_total * n),
            (CPU, request.cpu_milli * n),
            (MEMORY, request.memory * n),
        ):
            if key in quotas:
                verdict = ledger.fits(job.queue, key, amount)
                if not verdict.fits:
                    failed.append(verdict)
        if failed:
            return _status(failed)
        if not request.gpus or job.queue not in ledger.per_model:
            return SUCCESS
        demand = request.gpu_milli_total * n
        lut = view.model_lut
        refused: list[QuotaVerdict] = []
        for model_id, model in enumerate(cluster.nodes.models):
            if lut[model_id]:
                verdict = ledger.fits(job.queue, gpu_model_key(model), demand)
                if not verdict.fits:
                    lut[model_id] = False
                    refused.append(verdict)
        if not lut[: len(cluster.nodes.models)].any():
            return _status(refused) if refused else Status(Code.UNSCHEDULABLE, ("no GPU model left",), NAME)
        return SUCCESS
