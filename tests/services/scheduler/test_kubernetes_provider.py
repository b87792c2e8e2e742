"""The Kubernetes provider, driven through the official client against a fake API server over
HTTP: the manifests it creates (golden), where the job's secret goes, each state `poll` reads,
cancel's graceful stop, logs, and API errors named by object and status.

`TUNELOOP_UPDATE_GOLDEN=1` rewrites golden/kubernetes_job.json from what the provider sends.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration
from kubernetes.config import kube_config
from pydantic import ValidationError

from services.scheduler.kubernetes_manifest import object_name
from services.scheduler.kubernetes_provider import KubernetesError, KubernetesProvider
from services.scheduler.ladder import KubernetesOptions, ProviderSpec
from services.scheduler.providers import Handle, LaunchSpec, Status
from tests.fakes.kubernetes_api import FakeKubernetes, Recorded, RunningKubernetes
from tests.plugins.infra import free_port

GOLDEN = Path(__file__).parent / "golden" / "kubernetes_job.json"
WEBHOOK_SECRET = "whsec-3f9a1c2b7d6e4a58b0c1d2e3f4a5b6c7"
JOB = "tuneloop-attempt-0123456789ab"

CPU = ProviderSpec(
    name="cluster-cpu",
    kind="kubernetes",
    kubernetes=KubernetesOptions(namespace="ml", image="registry.example/tuneloop:1"),
)
KUEUE_GPU = ProviderSpec(
    name="cluster-h100",
    kind="kubernetes",
    device="nvidia-h100",
    device_count=8,
    max_runtime_s=14_400,
    kubernetes=KubernetesOptions(
        namespace="ml",
        image="registry.example/tuneloop:1",
        service_account="tuneloop-trainer",
        kueue_queue="gpu-queue",
        priority_class="batch-low",
        node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        storage_secret="tuneloop-storage",
        # An image of its own user and group (the defaults are deploy/Dockerfile's 10001).
        run_as_user=2000,
        run_as_group=3000,
    ),
)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeKubernetes]:
    with RunningKubernetes() as fake:
        yield fake


@pytest.fixture
def fake(server: FakeKubernetes) -> FakeKubernetes:
    server.reset()
    return server


def provider(fake: FakeKubernetes, spec: ProviderSpec = CPU) -> KubernetesProvider:
    client = ApiClient(Configuration(host=fake.url))
    return KubernetesProvider(spec, client, poll_interval_s=0.05, settle_s=2.0)


def launch(tmp_path: Path, **changes: Any) -> LaunchSpec:
    config = {
        "config_version": 1,
        "job_id": "ftjob-abc",
        "attempt_id": "attempt-0123456789ab",
        "tenant": "acme_corp",
        "output": {"prefix": "s3://tuneloop/acme_corp/ftjob-abc"},
        "webhook": {"url": "http://scheduler:8003/internal/trainer/ftjob-abc/reports"}
        | {"secret": WEBHOOK_SECRET},
    }
    fields: dict[str, Any] = {
        "job_id": "ftjob-abc",
        "attempt_id": "attempt-0123456789ab",
        "tenant": "acme_corp",
        "config": config,
        "work_dir": tmp_path,
        "env": {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4"},
    }
    return LaunchSpec(**(fields | changes))


def sent(fake: FakeKubernetes, method: str, part: str) -> list[Recorded]:
    return [r for r in fake.requests if r.method == method and part in r.path]


def manifests(fake: FakeKubernetes) -> dict[str, Any]:
    """What submit sent, with the volatile (the Job's uid) and the secret (job.json) replaced."""
    secret = json.loads(sent(fake, "POST", "/secrets")[0].body)
    secret["stringData"]["job.json"] = "<job.json>"
    patch = json.loads(sent(fake, "PATCH", "/secrets/")[0].body)
    patch["metadata"]["ownerReferences"][0]["uid"] = "<job uid>"
    job = json.loads(sent(fake, "POST", "/jobs")[0].body)
    return {"secret": secret, "secret_patch": patch, "job": job}


@pytest.mark.parametrize(
    ("case", "spec", "changes"),
    [
        ("cpu", CPU, {}),
        (
            "kueue_gpu",
            KUEUE_GPU,
            {
                "device": "nvidia-h100",
                "device_count": 8,
                "max_runtime_s": 3600.5,
                "resume_from": "s3://tuneloop/acme_corp/ftjob-abc/attempt-0/step-40",
                "resume_fallbacks": ("s3://tuneloop/acme_corp/ftjob-abc/attempt-0/step-30",),
            },
        ),
    ],
)
def test_submit_creates_the_golden_secret_and_job(
    fake: FakeKubernetes, tmp_path: Path, case: str, spec: ProviderSpec, changes: dict[str, Any]
) -> None:
    handle = provider(fake, spec).submit(launch(tmp_path, **changes))
    assert handle == Handle(spec.name, f"ml/{JOB}", str(tmp_path))
    created = manifests(fake)
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if os.environ.get("TUNELOOP_UPDATE_GOLDEN"):
        golden[case] = created
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(golden, indent=2, sort_keys=True) + "\n")
    assert created == golden[case]
    # In the cluster: the Secret holds job.json and is owned by the Job.
    job = fake.jobs[("ml", JOB)]
    secret = fake.secrets[("ml", JOB)]
    assert secret["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    stored = json.loads(base64.b64decode(secret["data"]["job.json"]))
    assert stored == launch(tmp_path).config


@pytest.mark.parametrize("field", ["run_as_user", "run_as_group"])
def test_a_rung_may_not_run_its_trainer_as_root(field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        KubernetesOptions(image="registry.example/tuneloop:1", **{field: 0})


def test_the_webhook_secret_is_only_ever_in_the_secret(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    kube = provider(fake, KUEUE_GPU)
    handle = kube.submit(launch(tmp_path))
    fake.admit(JOB)
    fake.run(JOB)
    kube.poll(handle)
    kube.cancel(handle, grace_s=1)
    carrying = [r for r in fake.requests if WEBHOOK_SECRET in r.path + r.body + str(r.query)]
    assert [(r.method, r.path) for r in carrying] == [("POST", "/api/v1/namespaces/ml/secrets")]
    assert WEBHOOK_SECRET not in json.dumps(manifests(fake))
    assert WEBHOOK_SECRET not in json.dumps([fake.jobs[("ml", JOB)], list(fake.pods.values())])


def test_the_secret_goes_with_its_job(fake: FakeKubernetes, tmp_path: Path) -> None:
    provider(fake).submit(launch(tmp_path))
    assert ("ml", JOB) in fake.secrets
    fake.lose(JOB)
    assert ("ml", JOB) not in fake.secrets


# poll ------------------------------------------------------------------------------------------


def test_poll_follows_a_job_from_pending_to_exited_normally(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    kube = provider(fake)
    handle = kube.submit(launch(tmp_path))
    assert kube.poll(handle) == Status("pending", reason="no pod running yet")
    fake.wait(JOB, "ImagePullBackOff", 'Back-off pulling image "registry.example/tuneloop:1"')
    assert kube.poll(handle) == Status(
        "pending", reason='ImagePullBackOff: Back-off pulling image "registry.example/tuneloop:1"'
    )
    fake.run(JOB)
    assert kube.poll(handle) == Status("running")
    fake.exit(JOB, 0)
    assert kube.poll(handle) == Status("exited", 0, "exited normally")


def test_a_queued_kueue_job_is_pending_until_admitted(fake: FakeKubernetes, tmp_path: Path) -> None:
    kube = provider(fake, KUEUE_GPU)
    handle = kube.submit(launch(tmp_path))
    assert fake.jobs[("ml", JOB)]["spec"]["suspend"] is True
    assert kube.poll(handle) == Status(
        "pending", reason="suspended: waiting to be admitted (Kueue)"
    )
    fake.admit(JOB)
    fake.run(JOB)
    assert kube.poll(handle).state == "running"


@pytest.mark.parametrize(
    ("code", "reason", "status"),
    [
        (3, "Error", Status("exited", 3, "exited with status 3")),
        (137, "OOMKilled", Status("exited", 137, "exited with status 137 (OOMKilled)")),
    ],
)
def test_poll_reads_the_exit_code_of_a_failed_trainer(
    fake: FakeKubernetes, tmp_path: Path, code: int, reason: str, status: Status
) -> None:
    kube = provider(fake)
    handle = kube.submit(launch(tmp_path))
    fake.run(JOB)
    fake.exit(JOB, code, reason)
    job = fake.jobs[("ml", JOB)]
    assert job["status"]["conditions"][-1]["reason"] == "PodFailurePolicy"
    assert kube.poll(handle) == status


def test_the_exit_code_is_read_from_the_job_once_the_pod_is_gone(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    kube = provider(fake)
    handle = kube.submit(launch(tmp_path))
    fake.run(JOB)
    fake.exit(JOB, 2)
    fake.pods.clear()
    assert kube.poll(handle) == Status("exited", 2, "exited with status 2")


def test_a_preempted_pod_is_preempted_not_failed(fake: FakeKubernetes, tmp_path: Path) -> None:
    kube = provider(fake)
    handle = kube.submit(launch(tmp_path))
    fake.run(JOB)
    fake.preempt(JOB)
    # The pod is deleted: the Job's condition (the DisruptionTarget rule) says what happened.
    status = kube.poll(handle)
    assert status.state == "preempted"
    assert "has condition DisruptionTarget" in status.reason
    assert not fake.pods  # and Kubernetes did not start it again: a new attempt is ours to make


def test_an_evicted_pod_still_there_names_its_disruption(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    kube = provider(fake)
    handle = kube.submit(launch(tmp_path))
    fake.run(JOB)
    pod = fake.pod(JOB)
    fake.preempt(JOB, reason="EvictionByEvictionAPI")
    fake.pods[("ml", pod["metadata"]["name"])] = pod  # not deleted yet
    status = kube.poll(handle)
    assert status.state == "preempted"
    assert status.reason.startswith("EvictionByEvictionAPI: ")


def test_past_its_deadline_the_attempt_exits_naming_the_limit(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    kube = provider(fake)
    handle = kube.submit(launch(tmp_path, max_runtime_s=600))
    fake.run(JOB)
    fake.exceed_deadline(JOB)
    assert kube.poll(handle) == Status("exited", None, "ran past its time limit of 600 s; stopped")


def test_a_deleted_job_is_lost(fake: FakeKubernetes, tmp_path: Path) -> None:
    kube = provider(fake)
    handle = kube.submit(launch(tmp_path))
    fake.run(JOB)
    fake.lose(JOB)
    assert kube.poll(handle) == Status("lost", reason=f"Job ml/{JOB} is gone (deleted, or lost)")


# cancel ----------------------------------------------------------------------------------------


def test_cancel_sends_sigterm_with_the_grace_and_reads_how_the_trainer_ended(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    kube = provider(fake)
    handle = kube.submit(launch(tmp_path))
    fake.run(JOB)
    pod = fake.pod(JOB)["metadata"]["name"]
    assert kube.cancel(handle, grace_s=30) == Status("exited", 0, "exited normally")
    [pod_delete] = sent(fake, "DELETE", "/pods/")
    assert pod_delete.path == f"/api/v1/namespaces/ml/pods/{pod}"
    assert pod_delete.query == {"gracePeriodSeconds": "30"}
    # The finished Job stays for its TTL: a poll meanwhile reads the same ending.
    assert not sent(fake, "DELETE", "/jobs/")
    assert kube.poll(handle) == Status("exited", 0, "exited normally")


def test_cancel_reports_the_kill_of_a_trainer_that_ignores_sigterm(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    kube = provider(fake)
    handle = kube.submit(launch(tmp_path))
    fake.run(JOB)
    fake.sigterm[JOB] = None
    assert kube.cancel(handle, grace_s=0.3) == Status("exited", 137, "exited with status 137")
    assert kube.poll(handle) == Status("exited", 137, "exited with status 137")


def test_cancel_deletes_a_job_whose_pod_outlives_the_grace_in_the_foreground(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    """The kubelet does not report the kill (its node is unreachable): the Job goes, and with it
    the pod and the Secret."""
    ticks = iter(range(0, 10_000, 5))
    kube = KubernetesProvider(
        CPU,
        ApiClient(Configuration(host=fake.url)),
        clock=lambda: next(ticks),
        sleep=lambda _: None,
    )
    handle = kube.submit(launch(tmp_path))
    fake.run(JOB)
    fake.sigterm[JOB] = None  # and killed only 30 s from now, in real time
    status = kube.cancel(handle, grace_s=30)
    assert status == Status("exited", None, "cancelled while running; its Job was deleted")
    [job_delete] = sent(fake, "DELETE", "/jobs/")
    assert job_delete.query == {"gracePeriodSeconds": "30", "propagationPolicy": "Foreground"}
    assert not fake.jobs
    assert not fake.pods
    assert not fake.secrets


def test_cancel_of_a_queued_job_deletes_it_before_it_starts(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    kube = provider(fake, KUEUE_GPU)
    handle = kube.submit(launch(tmp_path))
    status = kube.cancel(handle, grace_s=30)
    assert status == Status("exited", None, "cancelled while pending; its Job was deleted")
    assert not sent(fake, "DELETE", "/pods/")
    [job_delete] = sent(fake, "DELETE", "/jobs/")
    assert job_delete.query == {"gracePeriodSeconds": "30", "propagationPolicy": "Foreground"}
    assert not fake.jobs
    assert not fake.secrets


def test_cancel_of_a_job_already_gone_says_lost(fake: FakeKubernetes, tmp_path: Path) -> None:
    kube = provider(fake)
    handle = kube.submit(launch(tmp_path))
    fake.lose(JOB)
    assert kube.cancel(handle, grace_s=1).state == "lost"


# logs ------------------------------------------------------------------------------------------


def test_logs_are_the_tail_of_the_pods_log(fake: FakeKubernetes, tmp_path: Path) -> None:
    kube = provider(fake)
    handle = kube.submit(launch(tmp_path))
    assert kube.logs(handle) == ""  # its container has not started
    fake.run(JOB)
    fake.logs[fake.pod(JOB)["metadata"]["name"]] = "".join(
        f"step {step} loss 0.{step:04d}\n" for step in range(1000)
    )
    tail = kube.logs(handle, tail_bytes=200)
    assert len(tail.encode()) == 200
    assert tail.endswith("step 999 loss 0.0999\n")
    read = sent(fake, "GET", "/log")[-1]
    assert read.query == {"container": "trainer", "tailLines": "10"}
    fake.lose(JOB)
    assert kube.logs(handle) == ""


# errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "part", "code", "named"),
    [
        ("POST", "/secrets", 403, f"cannot create Secret ml/{JOB}: HTTP 403: secrets is forbidden"),
        ("POST", "/jobs", 409, f"cannot create Job ml/{JOB}: HTTP 409: jobs already exists"),
        ("PATCH", "/secrets/", 500, f"cannot set the owner of Secret ml/{JOB}: HTTP 500"),
    ],
)
def test_a_failed_submit_names_the_object_and_leaves_nothing_behind(
    fake: FakeKubernetes, tmp_path: Path, method: str, part: str, code: int, named: str
) -> None:
    fake.fail_next(method, part, code)
    with pytest.raises(KubernetesError, match=re.escape(named)) as raised:
        provider(fake).submit(launch(tmp_path))
    assert raised.value.status == code
    assert WEBHOOK_SECRET not in str(raised.value)
    assert raised.value.__cause__ is None
    assert raised.value.__suppress_context__  # the client's exception, with the body, stays out
    assert not fake.jobs
    assert not fake.secrets


def test_a_second_submit_of_an_attempt_is_refused_and_leaves_the_first_alone(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    kube = provider(fake)
    kube.submit(launch(tmp_path))
    first = (dict(fake.jobs), dict(fake.secrets))
    with pytest.raises(KubernetesError, match=rf"create Secret ml/{JOB}: HTTP 409: .* already"):
        kube.submit(launch(tmp_path))
    del fake.secrets[("ml", JOB)]  # even when only its Job is left, that Job is not deleted
    with pytest.raises(KubernetesError, match=rf"create Job ml/{JOB}: HTTP 409: .* already"):
        kube.submit(launch(tmp_path))
    assert fake.jobs == first[0]
    assert not fake.secrets


def test_a_server_error_while_polling_is_raised_not_taken_for_lost(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    kube = provider(fake)
    handle = kube.submit(launch(tmp_path))
    fake.fail_next("GET", f"/jobs/{JOB}", 500)
    with pytest.raises(KubernetesError, match=rf"cannot read Job ml/{JOB}: HTTP 500: Internal"):
        kube.poll(handle)


def test_an_unreachable_api_server_is_named(tmp_path: Path) -> None:
    client = ApiClient(Configuration(host=f"http://127.0.0.1:{free_port()}"))
    client.configuration.retries = 0
    kube = KubernetesProvider(CPU, client, request_timeout_s=2)
    with pytest.raises(
        KubernetesError, match=rf"cannot create Secret ml/{JOB}: no answer from the API server"
    ):
        kube.submit(launch(tmp_path))


def kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- {{name: fake, cluster: {{server: "{server}"}}}}
- {{name: elsewhere, cluster: {{server: "https://127.0.0.1:1"}}}}
users:
- {{name: scheduler, user: {{token: kube-t0ken}}}}
contexts:
- {{name: fake-cluster, context: {{cluster: fake, user: scheduler}}}}
- {{name: elsewhere, context: {{cluster: elsewhere, user: scheduler}}}}
current-context: elsewhere
"""
    )
    return path


def with_context(context: str) -> ProviderSpec:
    assert CPU.kubernetes is not None
    options = CPU.kubernetes.model_copy(update={"context": context})
    return CPU.model_copy(update={"kubernetes": options})


def test_without_a_client_the_kubeconfig_context_of_the_options_is_used(
    fake: FakeKubernetes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = kubeconfig(tmp_path, fake.url)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    handle = KubernetesProvider(with_context("fake-cluster")).submit(launch(tmp_path))
    assert handle.ref == f"ml/{JOB}"
    assert {r.authorization for r in fake.requests} == {"Bearer kube-t0ken"}


def test_an_unknown_context_fails_naming_the_provider(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = kubeconfig(tmp_path, "http://127.0.0.1:1")
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    with pytest.raises(
        KubernetesError, match="cannot load the configuration of provider cluster-cpu"
    ):
        KubernetesProvider(with_context("no-such-context"))


# names -----------------------------------------------------------------------------------------

ODD_IDS = [
    "attempt-0123456789ab",
    "Attempt_ABC.def",
    "attempt--",
    "-attempt",
    "attempt/../../etc",
    "ättempt-ü",
    "a" * 80,
    "a" * 80 + "b",
]


def test_names_from_odd_attempt_ids_are_valid_and_distinct() -> None:
    names = [object_name(attempt) for attempt in ODD_IDS]
    assert names[0] == "tuneloop-attempt-0123456789ab"
    for name in names:
        assert len(name) <= 63
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name
    assert len(set(names)) == len(names)


def test_the_api_accepts_a_job_for_an_odd_attempt_id(fake: FakeKubernetes, tmp_path: Path) -> None:
    odd = "Attempt_" + "X" * 70
    handle = provider(fake).submit(launch(tmp_path, attempt_id=odd))
    name = object_name(odd)
    assert handle.ref == f"ml/{name}"
    labels = fake.jobs[("ml", name)]["metadata"]["labels"]
    assert len(labels["tuneloop.dev/attempt"]) <= 63
