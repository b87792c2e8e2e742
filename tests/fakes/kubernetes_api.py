"""A fake Kubernetes API server over real HTTP, for the Kubernetes provider driven by the official
client: the Job, Secret and pod endpoints that provider calls, with the real API's JSON (kind,
apiVersion, metadata, spec, status; a `Status` for errors), objects in memory, and every request
kept for assertions.

A small Job controller stands in for the cluster: hooks put a Job's pod through what a cluster
does to it (running, exiting, preempted, past its deadline, deleted with its Job), and the Job's
own pod failure policy decides its conditions, with the controller's messages. A pod deleted
with a grace period exits as `on_sigterm` says: at once with a code, or killed (137) when the
grace runs out.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.fakes.serving import ServedInThread
from tests.plugins.infra import free_port

Object = dict[str, Any]
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 409: "AlreadyExists"}
_REASONS |= {422: "Invalid", 500: "InternalError"}
JOB_LABEL = "batch.kubernetes.io/job-name"


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: str
    authorization: str


class ApiError(Exception):
    def __init__(self, code: int, message: str, kind: str = "", name: str = "") -> None:
        super().__init__(message)
        self.code, self.message, self.kind, self.name = code, message, kind, name

    def response(self) -> JSONResponse:
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": _REASONS.get(self.code, "Unknown"),
            "details": {"name": self.name, "kind": self.kind},
            "code": self.code,
        }
        return JSONResponse(status, status_code=self.code)


class FakeKubernetes:
    def __init__(self, port: int) -> None:
        self.port = port
        self.lock = threading.RLock()
        self._clock = itertools.count()
        self.reset()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        with self.lock:
            self.jobs: dict[tuple[str, str], Object] = {}
            self.secrets: dict[tuple[str, str], Object] = {}
            self.pods: dict[tuple[str, str], Object] = {}
            self.logs: dict[str, str] = {}  # pod name -> its log
            self.requests: list[Recorded] = []
            self.failures: list[tuple[str, str, int]] = []
            # Job name -> the trainer's exit code on SIGTERM; None: it ignores SIGTERM.
            self.sigterm: dict[str, int | None] = {}
            self.kills: dict[tuple[str, str], float] = {}  # pod -> when the kubelet kills it

    # Test hooks: what the cluster does. -------------------------------------------------------

    def fail_next(self, method: str, path_part: str, code: int) -> None:
        """The next `method` request whose path contains `path_part` answers `code`."""
        self.failures.append((method, path_part, code))

    def pod(self, job: str) -> Object:
        with self.lock:
            return next(p for p in self.pods.values() if p["metadata"]["labels"][JOB_LABEL] == job)

    def run(self, job: str) -> None:
        with self.lock:
            pod = self.pod(job)
            pod["status"] |= {"phase": "Running", "startTime": self._now()}
            pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
            pod["status"]["containerStatuses"] = [
                _container({"running": {"startedAt": self._now()}}, ready=True)
            ]
            self._job_of(pod)["status"]["ready"] = 1

    def wait(self, job: str, reason: str, message: str) -> None:
        """The pod's container waits (pulling its image, ...)."""
        with self.lock:
            self.pod(job)["status"]["containerStatuses"] = [
                _container({"waiting": {"reason": reason, "message": message}})
            ]

    def exit(self, job: str, code: int, reason: str = "") -> None:
        with self.lock:
            self._terminate(self.pod(job), code, reason or ("Completed" if code == 0 else "Error"))

    def preempt(self, job: str, reason: str = "PreemptionByScheduler") -> None:
        """A disruption: the pod gets DisruptionTarget, is stopped (143) and deleted."""
        with self.lock:
            pod = self.pod(job)
            pod["status"]["conditions"] = [
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": reason,
                    "message": "default-scheduler: preempting to accommodate a higher priority pod",
                    "lastTransitionTime": self._now(),
                }
            ]
            self._terminate(pod, 143, "Error")
            self._remove_pod(pod)

    def exceed_deadline(self, job_name: str) -> None:
        """The Job ran past activeDeadlineSeconds: failed, its pods deleted."""
        with self.lock:
            job = next(j for j in self.jobs.values() if j["metadata"]["name"] == job_name)
            for pod in self._pods_of(job):
                self._remove_pod(pod)
            message = "Job was active longer than specified deadline"
            self._finish(job, "Failed", "DeadlineExceeded", message)

    def lose(self, job_name: str) -> None:
        """The Job is gone: deleted by someone, or its cluster lost."""
        with self.lock:
            job = next(j for j in self.jobs.values() if j["metadata"]["name"] == job_name)
            self._delete_job(job)

    def admit(self, job_name: str) -> None:
        """Kueue admits the Job: it is un-suspended and its pod created."""
        with self.lock:
            job = next(j for j in self.jobs.values() if j["metadata"]["name"] == job_name)
            job["spec"]["suspend"] = False
            self._start(job)

    # The controllers. --------------------------------------------------------------------------

    def _now(self) -> str:
        moment = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=next(self._clock))
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")

    def _job_of(self, pod: Object) -> Object:
        return self.jobs[(pod["metadata"]["namespace"], pod["metadata"]["labels"][JOB_LABEL])]

    def _pods_of(self, job: Object) -> list[Object]:
        name = job["metadata"]["name"]
        return [p for p in self.pods.values() if p["metadata"]["labels"][JOB_LABEL] == name]

    def _start(self, job: Object) -> None:
        meta = job["metadata"]
        name = f"{meta['name']}-{uuid.uuid4().hex[:5]}"
        template = copy.deepcopy(job["spec"]["template"])
        labels = template["metadata"].get("labels", {}) | {
            JOB_LABEL: meta["name"],
            "job-name": meta["name"],
            "batch.kubernetes.io/controller-uid": meta["uid"],
        }
        self.pods[(meta["namespace"], name)] = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "uid": str(uuid.uuid4()),
                "creationTimestamp": self._now(),
                "labels": labels,
                "ownerReferences": [_owner(job, controller=True)],
            },
            "spec": template["spec"],
            "status": {"phase": "Pending", "qosClass": "BestEffort"},
        }
        job["status"] |= {"active": 1, "startTime": job["status"].get("startTime", self._now())}

    def _terminate(self, pod: Object, code: int, reason: str) -> None:
        state = {"exitCode": code, "reason": reason, "finishedAt": self._now()}
        pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
        pod["status"]["containerStatuses"] = [_container({"terminated": state})]
        job = self._job_of(pod)
        job["status"]["active"] = 0
        job["status"].pop("ready", None)
        if code == 0:
            job["status"]["succeeded"] = 1
            self._finish(job, "Complete", "CompletionsReached", "Reached expected number")
        else:
            job["status"]["failed"] = 1
            self._apply_failure_policy(job, pod)

    def _apply_failure_policy(self, job: Object, pod: Object) -> None:
        """What the Job controller does with a failed pod: the first matching rule, else Count."""
        rules = job["spec"].get("podFailurePolicy", {}).get("rules", [])
        for index, rule in enumerate(rules):
            matched = _matches(rule, pod)
            if matched is None:
                continue
            if rule["action"] == "Ignore":
                self._start(job)
                return
            if rule["action"] == "FailJob":
                message = f"{matched} matching FailJob rule at index {index}"
                self._finish(job, "Failed", "PodFailurePolicy", message)
                return
            break
        if job["status"]["failed"] > job["spec"].get("backoffLimit", 6):
            message = "Job has reached the specified backoff limit"
            self._finish(job, "Failed", "BackoffLimitExceeded", message)
        else:
            self._start(job)

    def _finish(self, job: Object, kind: str, reason: str, message: str) -> None:
        interim = "FailureTarget" if kind == "Failed" else "SuccessCriteriaMet"
        job["status"]["conditions"] = [
            _condition(interim, reason, message, self._now()),
            _condition(kind, reason, message, self._now()),
        ]
        job["status"]["active"] = 0
        if kind == "Complete":
            job["status"]["completionTime"] = self._now()

    def _remove_pod(self, pod: Object) -> None:
        self.pods.pop((pod["metadata"]["namespace"], pod["metadata"]["name"]), None)

    def _delete_job(self, job: Object) -> None:
        """With the garbage collector's work done at once: its pods, and what it owns."""
        for pod in self._pods_of(job):
            self._remove_pod(pod)
        uid = job["metadata"]["uid"]
        for key, secret in list(self.secrets.items()):
            if any(o["uid"] == uid for o in secret["metadata"].get("ownerReferences", [])):
                del self.secrets[key]
        del self.jobs[(job["metadata"]["namespace"], job["metadata"]["name"])]

    def _kubelet(self) -> None:
        """Pods whose grace period ran out are killed."""
        for key, due in list(self.kills.items()):
            if time.monotonic() >= due and key in self.pods:
                del self.kills[key]
                self._terminate(self.pods[key], 137, "Error")
                self._remove_pod(self.pods[key])

    # HTTP. -------------------------------------------------------------------------------------

    async def _handle(self, request: Request) -> Response:
        body = (await request.body()).decode()
        recorded = Recorded(
            request.method,
            request.url.path,
            dict(request.query_params),
            request.headers.get("content-type", ""),
            body,
            request.headers.get("authorization", ""),
        )
        with self.lock:
            self.requests.append(recorded)
            self._kubelet()
            try:
                self._injected(recorded)
                return self._route(request, recorded)
            except ApiError as error:
                return error.response()

    def _injected(self, request: Recorded) -> None:
        for failure in self.failures:
            method, part, code = failure
            if method == request.method and part in request.path:
                self.failures.remove(failure)
                kind = request.path.split("/namespaces/")[1].split("/")[1]
                messages = {
                    403: f'{kind} is forbidden: User "system:serviceaccount:ml:tuneloop" cannot '
                    f'{request.method.lower()} resource "{kind}" in the namespace',
                    409: f"{kind} already exists",
                    500: "Internal error occurred: etcdserver: request timed out",
                }
                raise ApiError(code, messages.get(code, "injected"), kind)

    def _route(self, request: Request, recorded: Recorded) -> Response:
        ns = request.path_params["ns"]
        name = request.path_params.get("name")
        body = json.loads(recorded.body) if recorded.body else None
        kind = recorded.path.split("/namespaces/")[1].split("/")[1]
        if kind == "jobs":
            return self._jobs(request.method, ns, name, body, recorded.query)
        if kind == "secrets":
            return self._secrets(request.method, ns, name, body, recorded.content_type)
        if recorded.path.endswith("/log"):
            return self._log(ns, str(name), recorded.query)
        return self._pods_api(request.method, ns, name, recorded.query)

    def _jobs(
        self, method: str, ns: str, name: str | None, body: Any, query: dict[str, str]
    ) -> Response:
        if method == "POST":
            job = self._created(body, ns, "jobs.batch")
            spec = job["spec"]
            if (
                "podFailurePolicy" in spec
                and spec["template"]["spec"].get("restartPolicy") != "Never"
            ):
                raise ApiError(422, "spec.template.spec.restartPolicy: Invalid value", "jobs")
            job["status"] = {}
            self.jobs[(ns, job["metadata"]["name"])] = job
            if not spec.get("suspend"):
                self._start(job)
            return JSONResponse(job, status_code=201)
        job = self._get(self.jobs, ns, str(name), "jobs.batch")
        if method == "DELETE":
            self._delete_job(job)
            deleted = copy.deepcopy(job)
            deleted["metadata"] |= {"deletionTimestamp": self._now()}
            if query.get("propagationPolicy") == "Foreground":
                deleted["metadata"]["finalizers"] = ["foregroundDeletion"]
            return JSONResponse(deleted)
        return JSONResponse(job)

    def _secrets(
        self, method: str, ns: str, name: str | None, body: Any, content_type: str
    ) -> Response:
        if method == "POST":
            secret = self._created(body, ns, "secrets")
            encoded = {
                key: base64.b64encode(value.encode()).decode()
                for key, value in secret.pop("stringData", {}).items()
            }
            secret["data"] = secret.get("data", {}) | encoded
            self.secrets[(ns, secret["metadata"]["name"])] = secret
            return JSONResponse(secret, status_code=201)
        secret = self._get(self.secrets, ns, str(name), "secrets")
        if method == "PATCH":
            if content_type not in (
                "application/merge-patch+json",
                "application/strategic-merge-patch+json",
            ):
                raise ApiError(
                    400, f"the body of the request was in an unknown format ({content_type})"
                )
            _merge(secret, body)
        elif method == "DELETE":
            del self.secrets[(ns, str(name))]
        return JSONResponse(secret)

    def _pods_api(self, method: str, ns: str, name: str | None, query: dict[str, str]) -> Response:
        if method == "GET" and name is None:
            wanted = dict(
                term.split("=", 1) for term in query.get("labelSelector", "").split(",") if term
            )
            items = [
                pod
                for (pod_ns, _), pod in self.pods.items()
                if pod_ns == ns and wanted.items() <= pod["metadata"]["labels"].items()
            ]
            listing = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}}
            return JSONResponse(listing | {"items": items})
        pod = self._get(self.pods, ns, str(name), "pods")
        if method == "DELETE":
            self._delete_pod(pod, int(query.get("gracePeriodSeconds", "30")))
        return JSONResponse(pod)

    def _delete_pod(self, pod: Object, grace: int) -> None:
        """The kubelet sends SIGTERM; the trainer exits as `sigterm` says, or is killed later."""
        meta = pod["metadata"]
        meta |= {"deletionTimestamp": self._now(), "deletionGracePeriodSeconds": grace}
        if pod["status"]["phase"] not in ("Running",):
            self._remove_pod(pod)
            return
        code = self.sigterm.get(meta["labels"][JOB_LABEL], 0)
        if code is None:
            self.kills[(meta["namespace"], meta["name"])] = time.monotonic() + grace
        else:
            self._terminate(pod, code, "Completed" if code == 0 else "Error")
            self._remove_pod(pod)

    def _log(self, ns: str, name: str, query: dict[str, str]) -> Response:
        pod = self._get(self.pods, ns, name, "pods")
        if (
            not pod["status"].get("containerStatuses")
            or "waiting" in pod["status"]["containerStatuses"][0]["state"]
        ):
            raise ApiError(
                400, f'container "trainer" in pod "{name}" is waiting to start', "pods", name
            )
        lines = self.logs.get(name, "").splitlines(keepends=True)
        tail = int(query.get("tailLines", len(lines)))
        return PlainTextResponse("".join(lines[-tail:] if tail else []))

    def _created(self, body: Object, ns: str, kind: str) -> Object:
        obj = copy.deepcopy(body)
        meta = obj["metadata"]
        name = meta.get("name", "")
        if len(name) > 63 or not _NAME.fullmatch(name):
            raise ApiError(422, f'{kind} "{name}" is invalid: metadata.name', kind, name)
        store = self.jobs if kind == "jobs.batch" else self.secrets
        if (ns, name) in store:
            raise ApiError(409, f'{kind} "{name}" already exists', kind, name)
        meta |= {
            "namespace": ns,
            "uid": str(uuid.uuid4()),
            "resourceVersion": str(next(self._clock)),
            "creationTimestamp": self._now(),
        }
        return obj

    @staticmethod
    def _get(store: dict[tuple[str, str], Object], ns: str, name: str, kind: str) -> Object:
        if (ns, name) not in store:
            raise ApiError(404, f'{kind} "{name}" not found', kind, name)
        return store[(ns, name)]

    def app(self) -> Starlette:
        """Exactly the calls the provider makes; anything else answers 501, never a 404 that
        could pass for an object that is gone."""
        jobs, core = "/apis/batch/v1/namespaces/{ns}/jobs", "/api/v1/namespaces/{ns}"
        routes = [
            Route(jobs, self._handle, methods=["POST"]),
            Route(jobs + "/{name}", self._handle, methods=["GET", "DELETE"]),
            Route(core + "/secrets", self._handle, methods=["POST"]),
            Route(core + "/secrets/{name}", self._handle, methods=["GET", "PATCH", "DELETE"]),
            Route(core + "/pods", self._handle, methods=["GET"]),
            Route(core + "/pods/{name}", self._handle, methods=["DELETE"]),
            Route(core + "/pods/{name}/log", self._handle, methods=["GET"]),
            Route("/{path:path}", self._unknown, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
        ]
        return Starlette(routes=routes)

    async def _unknown(self, request: Request) -> Response:
        message = f"the fake does not serve {request.method} {request.url.path}"
        return ApiError(501, message).response()


def _container(state: Object, ready: bool = False) -> Object:
    return {
        "name": "trainer",
        "image": "registry.example/tuneloop:1",
        "imageID": "",
        "ready": ready,
        "restartCount": 0,
        "state": state,
    }


def _condition(kind: str, reason: str, message: str, now: str) -> Object:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastProbeTime": now,
        "lastTransitionTime": now,
    }


def _owner(obj: Object, *, controller: bool = False) -> Object:
    meta = obj["metadata"]
    owner = {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
    }
    return owner | ({"controller": True, "blockOwnerDeletion": True} if controller else {})


def _matches(rule: Object, pod: Object) -> str | None:
    """The Job controller's words for a rule that matches the failed pod, or None."""
    where = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    if "onPodConditions" in rule:
        for pattern in rule["onPodConditions"]:
            for condition in pod["status"].get("conditions", []):
                wanted = (pattern["type"], pattern.get("status", "True"))
                if (condition["type"], condition["status"]) == wanted:
                    return f"Pod {where} has condition {condition['type']}"
        return None
    codes = rule["onExitCodes"]
    for container in pod["status"].get("containerStatuses", []):
        terminated = container["state"].get("terminated")
        if terminated is None or codes.get("containerName", container["name"]) != container["name"]:
            continue
        code = terminated["exitCode"]
        if code != 0 and (code in codes["values"]) == (codes["operator"] == "In"):
            return f"Container {container['name']} for pod {where} failed with exit code {code}"
    return None


def _merge(target: Object, patch: Object) -> None:
    """RFC 7386 JSON merge patch."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class RunningKubernetes:
    """The fake served by uvicorn in a background thread."""

    def __init__(self) -> None:
        self.fake = FakeKubernetes(port=free_port())
        self.served = ServedInThread(self.fake.app(), self.fake.port, "fake Kubernetes API")

    def __enter__(self) -> FakeKubernetes:
        self.served.start()
        return self.fake

    def __exit__(self, *_: object) -> None:
        self.served.stop()
