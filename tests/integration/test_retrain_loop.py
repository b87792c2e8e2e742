"""The whole loop on real processes, twice: captured traffic -> a retrain policy -> dataset -> job
-> trainer -> evals -> decision -> a served version, and the next version its canary.

nats-server, SeaweedFS, SQLite (migrated), ingest (the gateway; the frontier model is a fake
OpenAI upstream), the scheduler (its local provider runs the real trainer), the evaluator and the
hoster (its CPU engines) each run as a process, on the tiny random Llama installed as the
catalogue's base. The tenant only ever calls the gateway: chat completions with the openai SDK,
our own routes with the SDK's generic get / post.

The task is one word for every question, which the tiny model learns in a few dozen LoRA steps
(tests/plugins/models.py, `tiny_stopping_model_dir`, says why it needs an end-of-turn embedding of
its own), so the scores are exact: the base 0.0, every version 1.0 on the eval split. The task
is a short label (exact match): one word, counted without the template around the turn.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from services.hoster.engines import stop_leftovers
from shared.dev import localstack
from shared.settings import Settings
from tests.fakes.serving import ServedInThread
from tests.fakes.upstream import upstream_key_env, upstreams_yaml
from tests.plugins.infra import RunningProcess, make_settings, settings_env
from tests.plugins.waiting import until
from tests.services.evaluator.evals_stack import Upstream
from tests.services.hoster.checkpoints import BASE_ID
from tests.services.hoster.process import prepare

pytestmark = pytest.mark.slow
FRONTIER = "gpt-4o-mini"  # routed by the gateway to the fake upstream
LABEL = "billing"
SERVED = "billing-desk"  # the job's suffix: the served name its versions deploy under
BATCH = 16  # calls a run's traffic; also the policy's min_new_samples
EVAL_ITEMS = 8  # the eval split: the evaluator's subset is all of it
POLICIES = "/fine_tuning/retrain_policies"
_WORDS = ("invoice", "refund", "card", "plan", "receipt", "charge", "tax", "discount")


@dataclass
class Loop:
    client: openai.OpenAI  # the tenant's, through the gateway
    upstream: Upstream


@pytest.fixture(scope="module")
def loop(
    nats_server: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tiny_stopping_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Loop]:
    tmp = tmp_path_factory.mktemp("retrain-loop")
    prepared = prepare(tmp, stack_settings, tiny_stopping_model_dir)
    settings = prepared.settings
    upstream = Upstream(answers={FRONTIER: {"": LABEL}})  # "" is in every question
    served = ServedInThread(
        Starlette(routes=[Route("/v1/chat/completions", upstream.chat, methods=["POST"])]),
        upstream.port,
        "fake OpenAI",
    )
    (tmp / "upstreams.yaml").write_text(upstreams_yaml(f"http://127.0.0.1:{upstream.port}"))
    env = settings_env(settings) | upstream_key_env() | {
        "TUNELOOP_INGEST_UPSTREAMS_FILE": str(tmp / "upstreams.yaml"),
        "TUNELOOP_SCHEDULER_POLL_INTERVAL_S": "0.5",
        "TUNELOOP_SCHEDULER_RETRAIN_INTERVAL_S": "0.5",
        "TUNELOOP_SCHEDULER_TRAINER_THREADS": "1",
        "TUNELOOP_HOSTER_ENGINE_LOAD_TIMEOUT_S": "240",
        "TUNELOOP_HOSTER_WATCH_INTERVAL_S": "0.5",
    }  # fmt: skip
    # A nats-server of its own: four services stopped with events in flight leave unacked
    # messages on their durable consumers, which the session's server would hand to the next
    # test's processes of the same names (and an in-process consumer new to it replays them).
    own_nats = make_settings(tmp / "nats")
    env |= {k: v for k, v in settings_env(own_nats).items() if k.startswith("TUNELOOP_NATS_")}
    served.start()
    processes = [RunningProcess(localstack.component(own_nats, "nats"), tmp / "logs" / "nats.log")]
    processes[0].start()
    try:
        # Stopped in reverse: the scheduler and evaluator, which poll ingest, before it.
        for name in ("ingest", "hoster", "evaluator", "scheduler"):
            process = RunningProcess(
                localstack.component(settings, name), tmp / "logs" / f"{name}.log", env=env
            )
            process.start(timeout_s=90)
            processes.append(process)
        url = f"http://127.0.0.1:{settings.services.ingest_port}/v1"
        yield Loop(openai.OpenAI(base_url=url, api_key=prepared.key, max_retries=0), upstream)
    finally:
        for process in reversed(processes):
            process.stop()
        stop_leftovers(tmp / "hoster" / "deployments")  # deployments outlive the hoster
        served.stop()
    # Nothing went wrong on the way that a retry hid (FastStream's own supervisor logs a pull
    # fetch that timed out on a busy CPU, which is not ours).
    errors = [
        line
        for process in processes
        for line in process.log().splitlines()
        if '"level":"ERROR"' in line and '.faststream"' not in line
    ]
    assert not errors, errors


def _get(client: openai.OpenAI, path: str) -> dict[str, Any]:
    return client.get(path, cast_to=dict[str, Any])


def _traffic(loop: Loop, first: int) -> None:
    """BATCH questions to the frontier model through the gateway, each one of its own (none is a
    duplicate or near-duplicate the dataset's cleaning would drop); every answer is LABEL."""
    for n in range(first, first + BATCH):
        question = f"Ticket {n}: a question about my {_WORDS[n % 8]} and {_WORDS[n // 8 % 8]}."
        answer = loop.client.chat.completions.create(
            model=FRONTIER, messages=[{"role": "user", "content": question}]
        )
        assert answer.choices[0].message.content == LABEL


def _run(loop: Loop, policy_id: str, run: int) -> dict[str, Any]:
    """The policy's `run`-th run, once its job has ended: the policy and the job."""

    def ran() -> dict[str, Any] | None:
        policy = _get(loop.client, f"{POLICIES}/{policy_id}")
        return policy if policy["runs"] == run else None

    policy = until(f"run {run}", ran, 300)

    def ended() -> Any:
        job = loop.client.fine_tuning.jobs.retrieve(policy["last_job_id"])
        return job if job.status in ("succeeded", "failed", "cancelled") else None

    return {"policy": policy, "job": until(f"run {run}'s job", ended, 300)}


def _served(loop: Loop, role: str) -> dict[str, Any]:
    """The served name once its `role` (primary or canary) deployment is ready, and that one."""

    def ready() -> dict[str, Any] | None:
        try:
            name = _get(loop.client, f"/served_names/{SERVED}")
        except openai.NotFoundError:
            return None
        if name[role] is None:
            return None
        deployment = _get(loop.client, f"/deployments/{name[role]}")
        assert deployment["status"] in ("pending", "ready"), deployment
        return {"name": name, "deployment": deployment} if deployment["status"] == "ready" else None

    return until(f"{SERVED!r}'s {role}", ready, 300)


@dataclass
class Runs:
    policy_id: str
    first: dict[str, Any]  # policy, job, eval (the evaluator's record), version (the model object)
    second: dict[str, Any]
    primary: dict[str, Any]  # the served name and its primary deployment after the first run
    canary: dict[str, Any]  # ... and its canary deployment after the second


@pytest.fixture(scope="module")
def runs(loop: Loop) -> Runs:
    client = loop.client
    policy = client.post(
        POLICIES,
        body={
            "name": "billing",
            "source": {"sources": ["gateway"], "models": [FRONTIER]},
            "split": {"eval_size": EVAL_ITEMS, "seed": 0},
            "trigger": {"min_new_samples": BATCH},
            "job": {
                "model": BASE_ID,
                "suffix": SERVED,
                "seed": 0,
                # Enough steps for the tiny model to say the label and stop (~60 a run).
                "method": {
                    "type": "supervised",
                    "supervised": {
                        "hyperparameters": {
                            "n_epochs": 20,
                            "batch_size": 1,
                            "learning_rate_multiplier": 10,
                        }
                    },
                },
            },
            "auto_deploy": True,
        },
        cast_to=dict[str, Any],
    )
    _traffic(loop, 0)
    first = _run(loop, policy["id"], 1)
    primary = _served(loop, "primary")
    # What the second run's decision compares with is serving now; new traffic arrives.
    _traffic(loop, BATCH)
    second = _run(loop, policy["id"], 2)
    canary = _served(loop, "canary")
    for run in (first, second):
        job = run["job"]
        run["eval"] = _get(client, f"/evals/{job.id}")
        run["version"] = _get(client, f"/models/{job.fine_tuned_model}")
        run["events"] = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=100)]
    return Runs(policy["id"], first, second, primary, canary)


def test_the_first_run_trains_on_the_captured_traffic_and_serves_its_version(runs: Runs) -> None:
    policy, job, evaluation = runs.first["policy"], runs.first["job"], runs.first["eval"]
    assert job.status == "succeeded", job.error
    assert job.training_file == policy["last_dataset_id"]
    assert job.metadata == {"retrain_policy": runs.policy_id}
    assert job.fine_tuned_model == f"ft:{BASE_ID}:{SERVED}:{job.id}"
    decisions = {d["name"]: d["value"] for d in job.decisions}
    assert decisions["task_kind"] == "short_label"
    assert (evaluation["task_kind"], evaluation["sample_count"]) == ("short_label", EVAL_ITEMS)
    assert job.hyperparameters.batch_size == 1  # as asked: one example a step, unpacked
    decision = evaluation["decision"]
    assert (decision["base_score"], decision["best_score"], decision["gate"]) == (
        0.0,
        1.0,
        "passed",
    )
    # Nothing served the name yet: no comparison, deployed as its primary.
    assert (decision["serving_version_id"], decision["serving_score"]) == (None, None)
    assert decision["beats_serving"] is None
    version = runs.first["version"]
    assert (version["job_id"], version["task_score"], version["gate"]) == (job.id, 1.0, "passed")
    name, deployment = runs.primary["name"], runs.primary["deployment"]
    assert deployment["version_id"] == version["version_id"]
    assert (deployment["model"], deployment["served_name"]) == (job.fine_tuned_model, SERVED)
    assert (name["canary"], deployment["role"]) == (None, "primary")
    started = (
        f"Started by retrain policy 'billing' (run 1): {BATCH} new samples (the trigger is {BATCH})"
    )
    assert started in runs.first["events"]
    chose = f"Chose step {decision['best_step']} (score 1.0, base 0.0); it passed the gate. "
    assert chose + decision["gate_reason"] in runs.first["events"]


def test_the_second_version_beats_the_serving_one_on_the_same_items_and_is_its_canary(
    runs: Runs,
) -> None:
    job, evaluation = runs.second["job"], runs.second["eval"]
    assert job.status == "succeeded", job.error
    assert job.training_file == runs.second["policy"]["last_dataset_id"]
    assert job.training_file != runs.first["job"].training_file
    decision = evaluation["decision"]
    first_version = runs.first["version"]["version_id"]
    assert (decision["best_score"], decision["gate"]) == (1.0, "passed")
    assert decision["serving_version_id"] == first_version
    assert (decision["serving_score"], decision["serving_items"]) == (1.0, EVAL_ITEMS)
    assert decision["beats_serving"] is (decision["best_score"] >= decision["serving_score"])
    assert decision["beats_serving"] is True
    sentence = (
        f"The new version scored 1.000 on {EVAL_ITEMS} eval items; the serving version v1 "
        f"({first_version}) of {SERVED!r} scored 1.000: it is deployed as the canary of "
        f"{SERVED!r}."
    )
    assert decision["gate_reason"].endswith(sentence)
    assert any(sentence in message for message in runs.second["events"]), runs.second["events"]
    name = runs.canary["name"]
    assert name["primary"] == runs.primary["name"]["primary"]
    primary = runs.primary["deployment"]
    assert (primary["version_id"], primary["role"]) == (first_version, "primary")
    canary = runs.canary["deployment"]
    assert canary["version_id"] == runs.second["version"]["version_id"] != first_version
    assert (canary["model"], canary["role"]) == (job.fine_tuned_model, "canary")
    assert name["canary_percent"] > 0


def test_the_served_name_answers_through_the_gateway_with_the_learned_label(
    loop: Loop, runs: Runs
) -> None:
    asked = len(loop.upstream.requests)
    for n in range(4):
        answer = loop.client.chat.completions.create(
            model=SERVED,
            messages=[{"role": "user", "content": f"Ticket {900 + n}: my {_WORDS[n]} is wrong."}],
        )
        assert answer.choices[0].message.content == LABEL
        assert answer.model in (
            runs.first["job"].fine_tuned_model,
            runs.second["job"].fine_tuned_model,
        )
    assert len(loop.upstream.requests) == asked  # answered by our versions, not the frontier
