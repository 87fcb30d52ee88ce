"""The pods (and the headless Service) of a job submitted to gpufleet itself on Kubernetes (`gpufleet submit` with
`image:`): one pod per worker of an attempt, in the namespace of the job's queue, made already placed
(`spec.nodeName`: the placement gpufleet decided), with the environment a distributed job reads.

A multi-worker job's rank 0 is found through a headless Service whose only endpoint is that pod, so
`MASTER_ADDR` is a name that resolves in the cluster's DNS; `MASTER_PORT` is the job's own (pods have addresses
of their own, so it never collides on a node, but two attempts of one job on one address would not either).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from gpufleet.adapters.kubernetes.objects import GPU_MILLI_ANNOTATION, GPU_RESOURCE, JOB_ID_LABEL, SCHEDULER_NAME
from gpufleet.domain.jobs import Job
from gpufleet.domain.resources import MILLI_PER_GPU
from gpufleet.ports import Launch

ATTEMPT_LABEL = "gpufleet.io/attempt"
RANK_LABEL = "gpufleet.io/rank"
PORT_BASE = 20_000
PORT_RANGE = 10_000


def dns_name(text: str) -> str:
    """A DNS-1123 label from `text`: lower case, letters, digits and '-', at most 63 characters."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return name[:63].rstrip("-") or "job"


def attempt_name(job: Job, attempt: int) -> str:
    return dns_name(f"{job.id}-a{attempt}")


def pod_name(job: Job, attempt: int, rank: int) -> str:
    return dns_name(f"{job.id}-a{attempt}-w{rank}")


def master_port(job: Job) -> int:
    return PORT_BASE + int(hashlib.sha256(job.id.encode()).hexdigest(), 16) % PORT_RANGE


def namespace_of(job: Job) -> str:
    return job.queue


def service_body(job: Job, attempt: int) -> dict[str, Any]:
    name = attempt_name(job, attempt)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace_of(job), "labels": {JOB_ID_LABEL: dns_name(job.id)}},
        "spec": {
            "clusterIP": "None",
            "selector": {JOB_ID_LABEL: dns_name(job.id), ATTEMPT_LABEL: str(attempt), RANK_LABEL: "0"},
            "ports": [{"name": "rendezvous", "port": master_port(job)}],
            "publishNotReadyAddresses": True,
        },
    }


def pod_bodies(launch: Launch, extra_env: dict[str, str]) -> list[dict[str, Any]]:
    """One pod per worker of the launch, by rank."""
    job, attempt = launch.job, launch.attempt
    run = job.run
    assert run is not None
    world = len(launch.workers)
    master = f"{attempt_name(job, attempt)}.{namespace_of(job)}.svc" if world > 1 else "localhost"
    command = ["/bin/sh", "-c", run.command[0]] if run.shell else list(run.command)
    request = job.request
    fractional = request.gpus == 1 and request.gpu_milli < MILLI_PER_GPU
    limits: dict[str, str] = {}
    if request.gpus and not fractional:
        limits[GPU_RESOURCE] = str(request.gpus)
    requests: dict[str, str] = {}
    if request.cpu_milli:
        requests["cpu"] = f"{request.cpu_milli}m"
    if request.memory:
        requests["memory"] = str(request.memory)
    bodies = []
    for rank, worker in enumerate(launch.workers):
        env = {
            **dict(run.env),
            **extra_env,
            "GPUFLEET_JOB_ID": job.id,
            "GPUFLEET_ATTEMPT": str(attempt),
            "RANK": str(rank),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": master,
            "MASTER_PORT": str(master_port(job)),
        }
        annotations = {"gpufleet.io/rank": str(rank)}
        if fractional:
            annotations[GPU_MILLI_ANNOTATION] = str(request.gpu_milli)
        bodies.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod_name(job, attempt, rank),
                    "namespace": namespace_of(job),
                    "labels": {JOB_ID_LABEL: dns_name(job.id), ATTEMPT_LABEL: str(attempt), RANK_LABEL: str(rank)},
                    "annotations": annotations,
                },
                "spec": {
                    "schedulerName": SCHEDULER_NAME,
                    "nodeName": worker.node,  # gpufleet's placement: made bound, as a binding would
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": int(run.grace_s),
                    "containers": [
                        {
                            "name": "worker",
                            "image": run.image,
                            "command": command,
                            "env": [{"name": key, "value": value} for key, value in sorted(env.items())],
                            "resources": {"limits": limits, "requests": requests},
                            "ports": [{"name": "rendezvous", "containerPort": master_port(job)}] if rank == 0 else [],
                        }
                    ],
                },
            }
        )
    return bodies
