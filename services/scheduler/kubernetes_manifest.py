"""What the Kubernetes provider creates for an attempt: a Secret holding its job.json, and a
batch/v1 Job of one pod that Kubernetes never retries (the scheduler owns retries), each named
for the attempt and labelled with its job, attempt and tenant.
"""

from __future__ import annotations

import hashlib
import json
import math
import re

from kubernetes.client import (
    V1Capabilities,
    V1Container,
    V1EnvFromSource,
    V1EnvVar,
    V1Job,
    V1JobSpec,
    V1ObjectMeta,
    V1PodFailurePolicy,
    V1PodFailurePolicyOnExitCodesRequirement,
    V1PodFailurePolicyOnPodConditionsPattern,
    V1PodFailurePolicyRule,
    V1PodSecurityContext,
    V1PodSpec,
    V1PodTemplateSpec,
    V1ResourceRequirements,
    V1SeccompProfile,
    V1Secret,
    V1SecretEnvSource,
    V1SecretVolumeSource,
    V1SecurityContext,
    V1Volume,
    V1VolumeMount,
)

from services.scheduler.ladder import KubernetesOptions, ProviderSpec
from services.scheduler.providers import CONFIG_FILE, LaunchSpec

CONFIG_DIR = "/etc/tuneloop"
CONTAINER = "trainer"
LABEL_JOB = "tuneloop.dev/job"
LABEL_ATTEMPT = "tuneloop.dev/attempt"
LABEL_TENANT = "tuneloop.dev/tenant"
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY = "kueue.x-k8s.io/priority-class"
# A finished Job, its pod and so its log stay a day; then the TTL controller deletes them and, by
# the owner reference, the Secret.
FINISHED_TTL_S = 86_400
# Object names become the pods' job-name label value: a DNS-1123 label, 63 characters at most.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")

POD_FAILURE_POLICY = V1PodFailurePolicy(
    rules=[
        # Preempted, evicted, its node drained or lost: the Job fails at once and `poll` says
        # `preempted`, which the scheduler does not count against the job's retries; it starts the
        # next attempt from the last committed checkpoint. (`Ignore` would have Kubernetes re-run
        # this attempt in place, from the checkpoint it was launched with, beside that recovery.)
        V1PodFailurePolicyRule(
            action="FailJob",
            on_pod_conditions=[
                V1PodFailurePolicyOnPodConditionsPattern(type="DisruptionTarget", status="True")
            ],
        ),
        # Any other non-zero exit fails the Job with the exit code in its condition's message,
        # still readable once the pod is gone.
        V1PodFailurePolicyRule(
            action="FailJob",
            on_exit_codes=V1PodFailurePolicyOnExitCodesRequirement(
                container_name=CONTAINER, operator="NotIn", values=[0]
            ),
        ),
    ]
)


def object_name(attempt_id: str) -> str:
    """`tuneloop-<attempt id>` as a DNS-1123 label: lowercase, other characters as `-`, and a
    hash of the id whenever it had to be changed or cut, so two attempts never share a name."""
    wanted = f"tuneloop-{attempt_id}"
    if len(wanted) <= 63 and _DNS_LABEL.fullmatch(wanted):
        return wanted
    cleaned = re.sub(r"[^a-z0-9-]+", "-", wanted.lower())[:54].rstrip("-")
    return f"{cleaned}-{hashlib.sha256(attempt_id.encode()).hexdigest()[:8]}"


def label_value(value: str) -> str:
    """A valid label value for an id (tenant ids always are, shared/tenancy.py), else a cleaned
    form with a hash of the original."""
    if len(value) <= 63 and _LABEL_VALUE.fullmatch(value):
        return value
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[:54].strip("-_.")
    return f"{cleaned}-{hashlib.sha256(value.encode()).hexdigest()[:8]}".lstrip("-")


def attempt_labels(spec: LaunchSpec) -> dict[str, str]:
    return {
        LABEL_JOB: label_value(spec.job_id),
        LABEL_ATTEMPT: label_value(spec.attempt_id),
        LABEL_TENANT: label_value(spec.tenant),
    }


def config_secret(spec: LaunchSpec, name: str, namespace: str) -> V1Secret:
    """job.json, which holds the job's webhook secret: only ever in this Secret."""
    return V1Secret(
        api_version="v1",
        kind="Secret",
        metadata=V1ObjectMeta(name=name, namespace=namespace, labels=attempt_labels(spec)),
        type="Opaque",
        string_data={CONFIG_FILE: json.dumps(spec.config)},
    )


def job_manifest(spec: LaunchSpec, provider: ProviderSpec, name: str) -> V1Job:
    options = provider.kubernetes
    assert options is not None
    labels = attempt_labels(spec)
    kueue = {KUEUE_QUEUE: options.kueue_queue, KUEUE_PRIORITY: options.priority_class}
    return V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=V1ObjectMeta(
            name=name,
            namespace=options.namespace,
            labels=labels | {key: value for key, value in kueue.items() if value},
        ),
        spec=V1JobSpec(
            backoff_limit=0,  # the scheduler owns retries
            active_deadline_seconds=_deadline_s(spec, provider),
            pod_failure_policy=POD_FAILURE_POLICY,
            ttl_seconds_after_finished=FINISHED_TTL_S,
            # Kueue admits a queued Job by un-suspending it; created running, it would start
            # before Kueue saw it.
            suspend=True if options.kueue_queue else None,
            template=V1PodTemplateSpec(
                metadata=V1ObjectMeta(labels=labels), spec=_pod_spec(spec, options, name)
            ),
        ),
    )


def _pod_spec(spec: LaunchSpec, options: KubernetesOptions, name: str) -> V1PodSpec:
    devices = {options.device_resource: str(spec.device_count)} if spec.device != "cpu" else None
    trainer = V1Container(
        name=CONTAINER,
        image=options.image,
        command=spec.trainer_argv(f"{CONFIG_DIR}/{CONFIG_FILE}"),
        env=[V1EnvVar(name=key, value=value) for key, value in sorted(spec.env.items())] or None,
        env_from=(
            [V1EnvFromSource(secret_ref=V1SecretEnvSource(name=options.storage_secret))]
            if options.storage_secret
            else None
        ),
        resources=V1ResourceRequirements(limits=devices, requests=devices) if devices else None,
        volume_mounts=[V1VolumeMount(name="job-config", mount_path=CONFIG_DIR, read_only=True)],
        # Pod Security `restricted`, with the pod's settings below.
        security_context=V1SecurityContext(
            allow_privilege_escalation=False, capabilities=V1Capabilities(drop=["ALL"])
        ),
    )
    return V1PodSpec(
        restart_policy="Never",  # a pod failure policy requires it; a retry is a new attempt
        containers=[trainer],
        # Never root. fsGroup: the kubelet gives the Secret volume's files (0400, owned by root)
        # to this group with group read (0440), so the trainer's user reads job.json.
        security_context=V1PodSecurityContext(
            run_as_non_root=True,
            run_as_user=options.run_as_user,
            run_as_group=options.run_as_group,
            fs_group=options.run_as_group,
            seccomp_profile=V1SeccompProfile(type="RuntimeDefault"),
        ),
        volumes=[
            V1Volume(
                name="job-config",
                secret=V1SecretVolumeSource(secret_name=name, default_mode=0o400),
            )
        ],
        node_selector=dict(options.node_selector) or None,
        service_account_name=options.service_account,
        # The trainer never calls the Kubernetes API: no token in its pod.
        automount_service_account_token=False,
    )


def _deadline_s(spec: LaunchSpec, provider: ProviderSpec) -> int | None:
    """The attempt's time limit, and never past the provider's."""
    limits = [s for s in (spec.max_runtime_s, provider.max_runtime_s) if s is not None]
    return math.ceil(min(limits)) if limits else None
