"""`tuneloop` against the running stack: nats-server (its own), SeaweedFS, a migrated SQLite, and
ingest (the gateway), the scheduler (its local provider runs the real trainer), the evaluator and
the hoster as processes, on the tiny Llama installed as the catalogue's base. Every command goes
through the gateway with the tenant's key, as a user's would; the tenant's SDK client checks
what the commands did.

One pass through the loop, each step a command: upload (a bad line among good ones), datasets
build (an `events tail` process receives the build's event), train (a process, interrupted by
SIGINT once it follows the job: the job goes on), jobs follow to the end, evals show, models list,
deploy, chat, canary / promote / rollback, undeploy; a second job paused, resumed and
cancelled; an eval's two runs shown and compared; refusals as one line with their status.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import Result

from shared.settings import Settings
from tests.integration.cli_stack import (
    BAD_ROLE_LINE,
    NOT_JSON_LINE,
    Running,
    Stack,
    running,
    training_lines,
    tuneloop,
)
from tests.plugins.infra import RunningProcess
from tests.plugins.waiting import until
from tests.services.evaluator.evals_stack import CRITERIA, ITEM_SCHEMA, QUESTIONS
from tests.services.hoster.checkpoints import BASE_ID

pytestmark = pytest.mark.slow
SUFFIX = "cli-desk"
SERVED = "cli-desk"
EVAL_ITEMS = 4


@pytest.fixture(scope="module")
def stack(
    s3_server: RunningProcess,
    stack_settings: Settings,
    tiny_stopping_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    with running(
        tmp_path_factory.mktemp("cli"), stack_settings, tiny_stopping_model_dir
    ) as started:
        yield started


# --- upload and datasets ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def uploaded(stack: Stack) -> tuple[Result, str]:
    path = stack.tmp / "tickets.jsonl"
    path.write_text("\n".join(training_lines()) + "\n")
    result = tuneloop(stack, "upload", str(path))
    match = re.search(r"uploaded tickets\.jsonl as (file-\S+)", result.stdout)
    assert match, result.output
    return result, match.group(1)


def test_upload_shows_the_rejected_lines_as_a_table_and_exits_4(
    stack: Stack, uploaded: tuple[Result, str]
) -> None:
    result, file_id = uploaded
    assert result.exit_code == 4, result.output
    rows = {
        int(m.group(1)): m.group(0)
        for m in re.finditer(r"^│ (\d+)\s+│.*$", result.stdout.split("rejected lines")[1], re.M)
    }
    assert sorted(rows) == [BAD_ROLE_LINE, NOT_JSON_LINE], result.stdout
    assert "role" in rows[BAD_ROLE_LINE]
    assert "robot" in rows[BAD_ROLE_LINE]
    found = stack.client.files.retrieve(file_id).model_dump()
    report = found["import_report"]
    assert (found["status"], report["accepted_lines"], report["rejected_lines"]) == (
        "processed",
        16,
        2,
    )
    assert re.search(r"│ accepted\s+│ 16\s+│", result.stdout)


@pytest.fixture(scope="module")
def built(stack: Stack, uploaded: tuple[Result, str]) -> dict[str, Any]:
    """`datasets build` from the upload, with `events tail` listening for the build's end."""
    tail = Running(
        stack, "events", "tail", "--filter", "dataset.built", "--count", "1",
        "--nats-url", stack.nats_url,
    )  # fmt: skip
    tail.wait_for("listening on tuneloop", stderr=True, timeout_s=30)
    result = tuneloop(
        stack, "datasets", "build", "--name", "cli-billing", "--file", uploaded[1],
        "--base-model", BASE_ID, "--eval-size", str(EVAL_ITEMS), "--seed", "0",
    )  # fmt: skip
    match = re.search(r"dataset (ds_\S+) queued", result.stdout)
    assert match, result.output
    return {"result": result, "id": match.group(1), "tail": tail, "tail_exit": tail.finish()}


def test_datasets_build_waits_for_the_build_and_shows_the_cleaning_report(
    stack: Stack, built: dict[str, Any]
) -> None:
    result, dataset_id = built["result"], built["id"]
    assert result.exit_code == 0, result.output
    dataset = stack.client.get(f"/datasets/{dataset_id}", cast_to=dict[str, Any])
    assert (dataset["status"], dataset["eval_count"]) == ("built", EVAL_ITEMS)
    assert re.search(rf"│ train\s+│ {dataset['train_count']}\s+│", result.stdout)
    report = result.stdout.split("cleaning report")[1]
    for step in dataset["report"]["steps"]:
        row = (step["step"], step["samples_in"], step["samples_out"], step["removed"])
        assert re.search(r"│ {}\s+│ {}\s+│ {}\s+│ {}\s+│".format(*row), report), (row, report)

    shown = tuneloop(stack, "datasets", "show", dataset_id)
    assert shown.exit_code == 0, shown.output
    assert "cleaning report" in shown.stdout
    assert dataset["version"] in shown.stdout
    listed = tuneloop(stack, "datasets", "list")
    assert listed.exit_code == 0, listed.output
    assert re.search(rf"│ {dataset_id}\s+│ cli-billing\s+│ built\s+│", listed.stdout)


def test_events_tail_prints_the_event_the_build_published(
    stack: Stack, built: dict[str, Any]
) -> None:
    tail = built["tail"]
    assert built["tail_exit"] == 0, tail.text()
    [event] = [line for line in tail.stdout if line.strip()]
    assert re.search(rf"\d\d:\d\d:\d\d  t\w+  dataset\.built  dataset_id={built['id']} ", event)
    assert f"eval_count={EVAL_ITEMS}" in event


# --- train and jobs -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(stack: Stack, built: dict[str, Any]) -> dict[str, Any]:
    """`train` as a process, interrupted (SIGINT, as Ctrl-C) once it follows the job; then `jobs
    follow` to the end."""
    train = Running(
        stack, "train", "--model", BASE_ID, "--file", built["id"], "--suffix", SUFFIX,
        "--epochs", "3", "--batch-size", "1", "--learning-rate-multiplier", "10", "--seed", "0",
    )  # fmt: skip
    job_id = re.search(r"job (ftjob-\S+)", train.wait_for(r"^job ftjob-")).group(1)  # type: ignore[union-attr]
    # Ctrl-C once the job exists, long before it can end (validation, planning and the base's
    # score come first). Not at a step line: the tiny model trains its 36 steps in two seconds,
    # and under a loaded CI one poll of the job's events can bring them all with the job's end,
    # after which `train` has exited 0 before the signal lands.
    train.wait_for(r"Validating training file")
    train.process.send_signal(signal.SIGINT)
    interrupted = train.finish()
    status_after = stack.client.fine_tuning.jobs.retrieve(job_id).status
    follow = Running(stack, "jobs", "follow", job_id)
    try:
        followed = follow.finish(timeout_s=240)
    except subprocess.TimeoutExpired:
        follow.process.kill()
        job = stack.client.fine_tuning.jobs.retrieve(job_id)
        logs = (stack.tmp / "logs" / "scheduler.log").read_text()[-4000:]
        pytest.fail(f"job {job_id} is still {job.status}:\n{follow.text()}\n{logs}")
    return {
        "id": job_id,
        "train": train,
        "interrupted": interrupted,
        "status_after": status_after,
        "follow": follow,
        "followed": followed,
        "job": stack.client.fine_tuning.jobs.retrieve(job_id),
    }


def test_ctrl_c_stops_train_following_and_leaves_the_job_running(trained: dict[str, Any]) -> None:
    train, job_id = trained["train"], trained["id"]
    assert trained["interrupted"] == 130, train.text()
    # Not cancelled: still going, or (a loaded machine answers late) already done.
    assert trained["status_after"] in ("validating_files", "queued", "running", "succeeded"), (
        train.text()
    )
    said = "".join(train.stdout)
    assert f"stopped following; job {job_id} is " in said
    assert f"tuneloop jobs follow {job_id}" in said
    assert "Traceback" not in train.text()


def test_jobs_follow_shows_the_job_to_its_end(trained: dict[str, Any]) -> None:
    follow, job = trained["follow"], trained["job"]
    said = "".join(follow.stdout)
    assert trained["followed"] == 0, follow.text()
    assert job.status == "succeeded", job.error
    assert job.fine_tuned_model == f"ft:{BASE_ID}:{SUFFIX}:{job.id}"
    assert re.search(r"│ status\s+│ succeeded\s+│", said)
    assert job.fine_tuned_model in said
    # Each step with the loss and the ETA: "-" until the job's pace is known, then h:mm:ss
    # (how it is reckoned: cli/test_pieces.py).
    assert re.search(r"Step \d+/\d+: training loss=\S+  \(ETA (-|\d+:\d\d:\d\d)\)", said), said
    assert re.search(r"task score \d", said), said


def test_jobs_list_and_show(stack: Stack, trained: dict[str, Any]) -> None:
    job = trained["job"]
    listed = tuneloop(stack, "jobs", "list")
    assert listed.exit_code == 0, listed.output
    assert re.search(
        rf"│ {job.id}\s+│ succeeded\s+│ {BASE_ID}\s+│ {re.escape(job.fine_tuned_model)}",
        listed.stdout,
    )
    shown = tuneloop(stack, "jobs", "show", job.id)
    assert shown.exit_code == 0, shown.output
    assert "decisions" in shown.stdout
    assert re.search(r"│ n_epochs\s+│ 3\s+│ user", shown.stdout)
    checkpoints = stack.client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert checkpoints
    for checkpoint in checkpoints:
        assert checkpoint.fine_tuned_model_checkpoint in shown.stdout


def test_an_api_error_is_one_line_with_its_status_and_no_traceback(
    stack: Stack, trained: dict[str, Any]
) -> None:
    job_id = trained["id"]
    refused = tuneloop(stack, "jobs", "cancel", job_id)
    assert refused.exit_code == 1
    assert refused.stderr == f"error: job {job_id} is already succeeded (HTTP 409)\n"
    assert refused.stdout == ""
    missing = tuneloop(stack, "datasets", "show", "ds_nope")
    assert missing.exit_code == 1
    assert missing.stderr == "error: dataset 'ds_nope' not found (HTTP 404)\n"
    bad_field = tuneloop(stack, "datasets", "build", "--name", "x", "--file", "file-nope")
    assert bad_field.exit_code == 1
    assert bad_field.stderr.startswith("error: file_ids[0]: ")
    assert "(HTTP 404)" in bad_field.stderr
    assert bad_field.stderr.count("\n") == 1
    spec = stack.tmp / "spec.json"
    spec.write_text(json.dumps({"name": "x", "file_ids": ["f"], "cleaning": {"max_token": 5}}))
    unknown = tuneloop(stack, "datasets", "build", "--spec", str(spec))
    assert unknown.exit_code == 1
    assert unknown.stderr == (
        "error: body.cleaning.max_token: Extra inputs are not permitted (HTTP 422)\n"
    )


def test_a_second_job_is_paused_resumed_and_cancelled(
    stack: Stack, built: dict[str, Any], trained: dict[str, Any]
) -> None:
    started = tuneloop(
        stack, "train", "--model", BASE_ID, "--file", built["id"], "--epochs", "50", "--detach"
    )
    assert started.exit_code == 0, started.output
    job_id = re.search(r"job (ftjob-\S+)", started.stdout).group(1)  # type: ignore[union-attr]
    assert f"follow it: tuneloop jobs follow {job_id}" in started.stdout
    jobs = stack.client.fine_tuning.jobs
    until("queued", lambda: jobs.retrieve(job_id).status in ("queued", "running") or None, 60)
    for verb, status in (("pause", "paused"), ("resume", "queued"), ("cancel", "cancelled")):
        done = tuneloop(stack, "jobs", verb, job_id)
        assert done.exit_code == 0, done.output
        assert done.stdout == f"job {job_id} {status} ({verb})\n"
        assert jobs.retrieve(job_id).status == status
    again = tuneloop(stack, "jobs", "resume", job_id)
    assert (again.exit_code, again.stderr.count("\n")) == (1, 1)
    assert "only a paused job resumes (HTTP 409)" in again.stderr


# --- evals, models, deployments, chat -----------------------------------------------------------


def test_evals_show_lists_the_job_s_points_and_each_item(
    stack: Stack, trained: dict[str, Any]
) -> None:
    job_id = trained["id"]
    evaluation = stack.client.get(f"/evals/{job_id}", cast_to=dict[str, Any])
    shown = tuneloop(stack, "evals", "show", job_id)
    assert shown.exit_code == 0, shown.output
    best = evaluation["best_step"]
    assert f"items at {best}" in shown.stdout
    items = stack.client.get(f"/evals/{job_id}/points/{best}/items", cast_to=dict[str, Any])
    assert len(items["data"]) == EVAL_ITEMS
    for item in items["data"]:
        assert re.search(rf"│ {item['position']}\s+│ Ticket \d+: a question", shown.stdout)
    base = tuneloop(stack, "evals", "show", job_id, "--step", "base")
    assert "items at base" in base.stdout
    for point in evaluation["points"]:
        assert re.search(rf"│ {point['step']}\s+│", shown.stdout)


def test_models_list_shows_the_base_and_the_fine_tuned_version(
    stack: Stack, trained: dict[str, Any]
) -> None:
    listed = tuneloop(stack, "models", "list")
    assert listed.exit_code == 0, listed.output
    assert re.search(rf"│ {BASE_ID}\s+│ \(base\)", listed.stdout)
    name = trained["job"].fine_tuned_model
    assert re.search(rf"│ {re.escape(name)}\s+│ {BASE_ID}\s+│ 1\s+│", listed.stdout), listed.stdout


def test_deploy_chat_canary_promote_rollback_undeploy(
    stack: Stack, trained: dict[str, Any]
) -> None:
    name = trained["job"].fine_tuned_model
    deployed = tuneloop(stack, "deploy", name, "--served-name", SERVED)
    assert deployed.exit_code == 0, deployed.output
    assert re.search(r"│ status\s+│ ready\s+│", deployed.stdout), deployed.stdout
    primary = stack.client.get(f"/served_names/{SERVED}", cast_to=dict[str, Any])["primary"]
    assert primary
    assert primary in deployed.stdout

    said = "Ticket 99: my tax.\n/reset\nhello\n/exit\n"
    chat = tuneloop(stack, "chat", SERVED, "--max-tokens", "8", input=said)
    assert chat.exit_code == 0, chat.output
    assert chat.stdout.count(f"{SERVED}> ") == 2
    assert "(conversation forgotten)" in chat.stdout
    assert chat.stderr == ""

    canary = tuneloop(stack, "canary", SERVED, BASE_ID, "--percent", "50")
    assert canary.exit_code == 0, canary.output
    served = stack.client.get(f"/served_names/{SERVED}", cast_to=dict[str, Any])
    assert (served["primary"], served["canary_percent"]) == (primary, 50.0)
    assert re.search(rf"│ canary\s+│ {served['canary']}\s+│", canary.stdout)
    promoted = tuneloop(stack, "promote", SERVED)
    assert promoted.exit_code == 0, promoted.output
    served = stack.client.get(f"/served_names/{SERVED}", cast_to=dict[str, Any])
    assert (served["primary"], served["previous"]) != (primary, None)
    assert served["previous"] == primary
    rolled = tuneloop(stack, "rollback", SERVED)
    assert rolled.exit_code == 0, rolled.output
    served = stack.client.get(f"/served_names/{SERVED}", cast_to=dict[str, Any])
    assert served["primary"] == primary
    assert re.search(rf"│ primary\s+│ {primary}\s+│", rolled.stdout)

    listed = tuneloop(stack, "deployments")
    assert re.search(rf"│ {primary}\s+│ {re.escape(name)}\s+│ ready\s+│ {SERVED}", listed.stdout)
    stopped = tuneloop(stack, "undeploy", primary)
    assert stopped.exit_code == 0, stopped.output
    assert re.search(r"│ status\s+│ stopped\s+│", stopped.stdout)


def test_chat_says_what_was_refused_and_goes_on(stack: Stack) -> None:
    chat = tuneloop(stack, "chat", "no-such-model", input="hello\nagain\n")
    assert chat.exit_code == 0, chat.output
    errors = chat.stderr.splitlines()
    assert len(errors) == 2
    assert all(e.startswith("error: ") for e in errors)
    assert all(e.endswith("(HTTP 404)") for e in errors), errors


def test_evals_show_a_run_and_compare_two(stack: Stack) -> None:
    client = stack.client
    created = client.evals.create(
        name="capitals",
        data_source_config={
            "type": "custom",
            "item_schema": ITEM_SCHEMA,
            "include_sample_schema": True,
        },
        testing_criteria=CRITERIA,
    )

    def run(outputs: list[str]) -> str:
        rows = [
            {"item": q, "sample": {"output_text": o}}
            for q, o in zip(QUESTIONS, outputs, strict=True)
        ]
        source = {"type": "file_content", "content": rows}
        made = client.evals.runs.create(created.id, data_source={"type": "jsonl", "source": source})
        until(
            "the run",
            lambda: (
                client.evals.runs.retrieve(made.id, eval_id=created.id).status == "completed"
                or None
            ),
            60,
        )
        return made.id

    base = run(["Paris"] * len(QUESTIONS))
    candidate = run([q["answer"] for q in QUESTIONS])
    shown = tuneloop(stack, "evals", "show", created.id, "--run", base)
    assert shown.exit_code == 0, shown.output
    assert re.search(r"│ passed\s+│ 1\s+│", shown.stdout)
    assert re.search(r"│ failed\s+│ 4\s+│", shown.stdout)
    assert re.search(r"│ 0\s+│ .*capital of France.*│ Paris\s+│ pass\s+│ exact 1,", shown.stdout), (
        shown.stdout
    )
    compared = tuneloop(stack, "evals", "compare", base, candidate)
    assert compared.exit_code == 0, compared.output
    assert "regressed 0, errored 0, unchanged 1, improved 4" in compared.stdout
    assert re.search(rf"│ candidate\s+│ {candidate}\s+│", compared.stdout)
    assert compared.stdout.count("improved") == 5  # the counts, and four items


def test_a_service_away_behind_the_gateway_is_exit_3(stack: Stack) -> None:
    """Last: it stops the scheduler. The gateway answers 503 naming it; nothing is retried
    into a hang and nothing is a traceback."""
    stack.processes["scheduler"].stop()
    away = tuneloop(stack, "jobs", "list")
    assert away.exit_code == 3
    assert re.fullmatch(
        r"error: scheduler at http://\S+ is not reachable \(\w+\) \(HTTP 503\)\n", away.stderr
    ), away.stderr
