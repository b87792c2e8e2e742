"""The Kubernetes rung of the ladder: each attempt runs as a batch/v1 Job (kubernetes_manifest.py
says what is created) through the official `kubernetes` client, and its Job and pod are read
back as the attempt's status: a crash, a preemption or the time limit each end the attempt, and
the scheduler decides what comes next.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import time
from collections.abc import Callable
from typing import TypeVar

import urllib3
from kubernetes import config as kubeconfig
from kubernetes.client import (
    ApiClient,
    BatchV1Api,
    Configuration,
    CoreV1Api,
    V1Job,
    V1JobCondition,
    V1Pod,
)
from kubernetes.client.exceptions import ApiException

from services.scheduler.kubernetes_manifest import (
    CONTAINER,
    config_secret,
    job_manifest,
    object_name,
)
from services.scheduler.ladder import KubernetesOptions, ProviderSpec
from services.scheduler.providers import Handle, LaunchSpec, Status

T = TypeVar("T")

# Set by the Job controller on the pods it creates (the older `job-name` too, until removed).
POD_JOB_LABEL = "batch.kubernetes.io/job-name"
# The Job controller's message for a pod failure policy rule that matched an exit code.
_EXIT_CODE = re.compile(r"failed with exit code (-?\d+)")


class KubernetesError(RuntimeError):
    """A Kubernetes API call failed. The message names the call, the object and the HTTP status
    with the API's own one-line reason; never a request body, which may hold the job's secret."""

    def __init__(self, action: str, obj: str, status: int | None, detail: str) -> None:
        self.status = status
        http = f"HTTP {status}: " if status is not None else ""
        super().__init__(f"Kubernetes: cannot {action} {obj}: {http}{detail}")

    @classmethod
    def of(cls, exc: ApiException, action: str, obj: str) -> KubernetesError:
        try:
            detail = str(json.loads(exc.body or "")["message"])
        except (ValueError, KeyError, TypeError):
            detail = str(exc.reason or "")
        return cls(action, obj, exc.status, detail[:300])


def _call(action: str, obj: str, request: Callable[[], T]) -> T:
    try:
        return request()
    except ApiException as exc:
        raise KubernetesError.of(exc, action, obj) from None
    except urllib3.exceptions.HTTPError as exc:
        detail = f"no answer from the API server ({type(exc).__name__})"
        raise KubernetesError(action, obj, None, detail) from None


class KubernetesProvider:
    """One `ProviderSpec` of kind kubernetes. Pass `api_client` to talk to a given server (tests);
    otherwise the kubeconfig context named in the options, or the in-cluster service account."""

    def __init__(
        self,
        spec: ProviderSpec,
        api_client: ApiClient | None = None,
        *,
        request_timeout_s: float = 30.0,
        poll_interval_s: float = 2.0,
        settle_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if spec.kubernetes is None:
            raise ValueError(f"provider {spec.name} is of kind {spec.kind}, not kubernetes")
        self.name = spec.name
        self.spec = spec
        self.options: KubernetesOptions = spec.kubernetes
        client = api_client if api_client is not None else load_client(self.options, spec.name)
        self.batch = BatchV1Api(client)
        self.core = CoreV1Api(client)
        self.timeout = request_timeout_s
        self.poll_interval_s = poll_interval_s
        # After the grace period: how long the kubelet's SIGKILL takes to show in the API.
        self.settle_s = settle_s
        self.clock = clock
        self.sleep = sleep

    def submit(self, spec: LaunchSpec) -> Handle:
        """The Secret first, so the pod never waits for its volume; then the Job; then the Job
        becomes the Secret's owner, so whatever deletes the Job deletes the secret with it."""
        ns, name = self.options.namespace, object_name(spec.attempt_id)
        secret = config_secret(spec, name, ns)
        _call(
            "create",
            f"Secret {ns}/{name}",
            lambda: self.core.create_namespaced_secret(ns, secret, _request_timeout=self.timeout),
        )
        job: V1Job | None = None
        try:
            job = _call(
                "create",
                f"Job {ns}/{name}",
                lambda: self.batch.create_namespaced_job(
                    ns, job_manifest(spec, self.spec, name), _request_timeout=self.timeout
                ),
            )
            self._own(job, name)
        except KubernetesError:
            # What this call made goes (a Job already there under this name is not its to delete).
            self._discard(ns, name, job=job is not None)
            raise
        return Handle(provider=self.name, ref=f"{ns}/{name}", work_dir=str(spec.work_dir))

    def poll(self, handle: Handle) -> Status:
        ns, name = _ref(handle)
        try:
            job = self._job(ns, name)
        except KubernetesError as exc:
            if exc.status == 404:
                return Status("lost", reason=f"Job {ns}/{name} is gone (deleted, or lost)")
            raise
        return attempt_status(job, self._pods(ns, name))

    def cancel(self, handle: Handle, *, grace_s: float) -> Status:
        """SIGTERM to a running trainer (it checkpoints), SIGKILL after `grace_s`; a Job that has
        not finished by then, or never started, is deleted so that it cannot start later.

        The grace period goes with the deletion of the pod: deleting the Job would not pass it on
        (the garbage collector deletes its pods with their own default, 30 s). A Job that ended
        is left to its TTL, so a poll meanwhile still reads how the trainer ended."""
        ns, name = _ref(handle)
        grace = math.ceil(grace_s)
        running = [pod for pod in self._pods(ns, name) if _phase(pod) == "Running"]
        for pod in running:
            self._delete_pod(ns, _name(pod), grace)
        status = self._wait_ended(handle, grace_s) if running else self.poll(handle)
        if status.state not in ("pending", "running"):
            return status
        _call(
            "delete",
            f"Job {ns}/{name}",
            lambda: _unless_gone(
                lambda: self.batch.delete_namespaced_job(
                    name,
                    ns,
                    grace_period_seconds=grace,
                    propagation_policy="Foreground",  # its pods and its Secret go first
                    _request_timeout=self.timeout,
                )
            ),
        )
        return Status("exited", None, f"cancelled while {status.state}; its Job was deleted")

    def logs(self, handle: Handle, *, tail_bytes: int = 20_000) -> str:
        """The newest pod's log tail. The API cuts by lines (`limitBytes` counts from the start),
        so ask for enough lines and cut the bytes here."""
        ns, name = _ref(handle)
        pods = self._pods(ns, name)
        if not pods:
            return ""
        pod = _name(max(pods, key=_created))
        try:
            text = _call(
                "read the log of",
                f"Pod {ns}/{pod}",
                lambda: self.core.read_namespaced_pod_log(
                    pod,
                    ns,
                    container=CONTAINER,
                    tail_lines=max(10, tail_bytes // 20),
                    _request_timeout=self.timeout,
                ),
            )
        except KubernetesError as exc:
            if exc.status in (400, 404):  # not started yet, or gone
                return ""
            raise
        return text.encode()[-tail_bytes:].decode(errors="replace")

    def _own(self, job: V1Job, name: str) -> None:
        ns = self.options.namespace
        assert job.metadata is not None
        assert job.metadata.uid is not None
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job.metadata.uid}
        _call(
            "set the owner of",
            f"Secret {ns}/{name}",
            lambda: self.core.patch_namespaced_secret(
                name,
                ns,
                {"metadata": {"ownerReferences": [owner]}},
                _content_type="application/merge-patch+json",
                _request_timeout=self.timeout,
            ),
        )

    def _discard(self, ns: str, name: str, *, job: bool) -> None:
        """Best effort after a failed submit: no half-made attempt, no orphaned secret."""
        with contextlib.suppress(ApiException, urllib3.exceptions.HTTPError):
            if job:
                _unless_gone(
                    lambda: self.batch.delete_namespaced_job(
                        name, ns, propagation_policy="Background"
                    )
                )
        with contextlib.suppress(ApiException, urllib3.exceptions.HTTPError):
            _unless_gone(lambda: self.core.delete_namespaced_secret(name, ns))

    def _job(self, ns: str, name: str) -> V1Job:
        return _call(
            "read",
            f"Job {ns}/{name}",
            lambda: self.batch.read_namespaced_job(name, ns, _request_timeout=self.timeout),
        )

    def _pods(self, ns: str, name: str) -> list[V1Pod]:
        pods = _call(
            "list the pods of",
            f"Job {ns}/{name}",
            lambda: self.core.list_namespaced_pod(
                ns, label_selector=f"{POD_JOB_LABEL}={name}", _request_timeout=self.timeout
            ),
        )
        return list(pods.items)

    def _delete_pod(self, ns: str, pod: str, grace: int) -> None:
        _call(
            "delete",
            f"Pod {ns}/{pod}",
            lambda: _unless_gone(
                lambda: self.core.delete_namespaced_pod(
                    pod, ns, grace_period_seconds=grace, _request_timeout=self.timeout
                )
            ),
        )

    def _wait_ended(self, handle: Handle, grace_s: float) -> Status:
        deadline = self.clock() + grace_s + self.settle_s
        while True:
            status = self.poll(handle)
            if status.state not in ("pending", "running") or self.clock() >= deadline:
                return status
            self.sleep(self.poll_interval_s)


def load_client(options: KubernetesOptions, provider: str) -> ApiClient:
    """The kubeconfig context named in the options; without one, the pod's service account when
    running in a cluster, else the kubeconfig's current context."""
    try:
        if options.context is None and "KUBERNETES_SERVICE_HOST" in os.environ:
            configuration = Configuration()
            kubeconfig.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return ApiClient(configuration)
        client: ApiClient = kubeconfig.new_client_from_config(context=options.context)  # type: ignore[no-untyped-call]
        return client
    except (kubeconfig.ConfigException, OSError) as exc:
        detail = str(exc)
        raise KubernetesError(
            "load the configuration of", f"provider {provider}", None, detail
        ) from None


def attempt_status(job: V1Job, pods: list[V1Pod]) -> Status:
    """Where an attempt stands, from its Job and the Job's pods (which may already be gone)."""
    conditions = {
        c.type: c
        for c in (job.status.conditions if job.status else None) or []
        if c.status == "True"
    }
    if "Complete" in conditions:
        return Status("exited", 0, "exited normally")
    if "Failed" in conditions:
        return _failed(job, conditions["Failed"], pods)
    if job.spec is not None and job.spec.suspend:
        return Status("pending", reason="suspended: waiting to be admitted (Kueue)")
    if any(_phase(pod) != "Pending" for pod in pods):
        return Status("running")
    waiting = [reason for pod in pods if (reason := _waiting(pod))]
    return Status("pending", reason=waiting[0] if waiting else "no pod running yet")


def _failed(job: V1Job, condition: V1JobCondition, pods: list[V1Pod]) -> Status:
    pod = max(pods, key=_created) if pods else None
    message = condition.message or ""
    code, how = _exit(pod) if pod else (None, "")
    if code is None and (found := _EXIT_CODE.search(message)):
        code = int(found.group(1))
    if condition.reason == "DeadlineExceeded":
        limit = job.spec.active_deadline_seconds if job.spec else None
        return Status("exited", code, f"ran past its time limit of {limit} s; stopped")
    # The pod failure policy's first rule; the pod itself, while it is still there, says more.
    disruption = _disruption(pod) if pod else None
    if disruption or "condition DisruptionTarget" in message:
        return Status("preempted", reason=disruption or message)
    if code is not None:
        return Status("exited", code, f"exited with status {code}{how}")
    return Status("exited", None, f"the Job failed: {condition.reason}: {message}".rstrip(": "))


def _exit(pod: V1Pod) -> tuple[int | None, str]:
    """The trainer container's exit code, with its reason when it says more than `Error`."""
    for container in (pod.status.container_statuses if pod.status else None) or []:
        terminated = container.state.terminated if container.state else None
        if container.name == CONTAINER and terminated is not None:
            reason = terminated.reason or ""
            return terminated.exit_code, f" ({reason})" if reason not in ("", "Error") else ""
    return None, ""


def _disruption(pod: V1Pod) -> str | None:
    for condition in (pod.status.conditions if pod.status else None) or []:
        if condition.type == "DisruptionTarget" and condition.status == "True":
            return _said(condition.reason, condition.message)
    return None


def _waiting(pod: V1Pod) -> str | None:
    """Why a pending pod is not running yet (unschedulable, pulling its image, ...)."""
    for container in (pod.status.container_statuses if pod.status else None) or []:
        waiting = container.state.waiting if container.state else None
        if waiting is not None and waiting.reason:
            return _said(waiting.reason, waiting.message)
    for condition in (pod.status.conditions if pod.status else None) or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return _said(condition.reason, condition.message)
    return None


def _said(reason: str | None, message: str | None) -> str | None:
    return f"{reason}: {message}" if reason and message else reason or message


def _phase(pod: V1Pod) -> str:
    return (pod.status.phase if pod.status else None) or "Pending"


def _name(pod: V1Pod) -> str:
    assert pod.metadata is not None
    assert pod.metadata.name is not None
    return pod.metadata.name


def _created(pod: V1Pod) -> str:
    created = pod.metadata.creation_timestamp if pod.metadata else None
    return created.isoformat() if created else ""


def _ref(handle: Handle) -> tuple[str, str]:
    ns, _, name = handle.ref.partition("/")
    return ns, name


def _unless_gone(request: Callable[[], object]) -> None:
    """A delete whose object is already gone has done its work."""
    try:
        request()
    except ApiException as exc:
        if exc.status != 404:
            raise
