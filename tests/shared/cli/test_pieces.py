"""The CLI's own logic, without a stack: the dataset spec the options make, the pace a job's ETA
comes from, how an event is printed and filtered, and the one line a command ends with when
nothing answers at its base URL. Against the running stack: tests/integration/test_cli.py."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from shared.dev.cli import app
from shared.dev.cli.datasets import build_spec
from shared.dev.cli.errors import USAGE, CliError
from shared.dev.cli.events import Tail, line, name_of
from shared.dev.cli.follow import Pace, total_steps
from shared.events import DatasetBuilt
from tests.plugins.infra import free_port

NO_OPTIONS: dict[str, object] = {
    "name": None, "files": [], "eval_files": [], "base_model": None, "models": [], "tags": [],
    "since": None, "eval_size": None, "seed": None,
}  # fmt: skip


def test_options_go_on_top_of_the_spec_file() -> None:
    spec = {
        "name": "from-file",
        "source": {"models": ["gpt-4o"], "status": "ok"},
        "split": {"seed": 1},
    }
    options = NO_OPTIONS | {
        "name": "support",
        "tags": ["vip"],
        "eval_size": 200.0,
        "files": ["file-a"],
    }
    assert build_spec(spec, **options) == {  # type: ignore[arg-type]
        "name": "support",
        "source": {"models": ["gpt-4o"], "status": "ok", "tags": ["vip"]},
        "file_ids": ["file-a"],
        "split": {"seed": 1, "eval_size": 200},  # a count stays a count, not 200.0
    }
    fraction = build_spec({"name": "x"}, **NO_OPTIONS | {"eval_size": 0.1})  # type: ignore[arg-type]
    assert fraction["split"] == {"eval_size": 0.1}


def test_a_dataset_without_a_name_is_a_usage_error() -> None:
    with pytest.raises(CliError) as refused:
        build_spec({}, **NO_OPTIONS)  # type: ignore[arg-type]
    assert refused.value.code == USAGE
    assert refused.value.message.startswith("--name: ")


def test_the_eta_comes_from_the_steps_own_times() -> None:
    pace = Pace()
    assert pace.remaining(60) is None
    pace.add(1, 1000.0)
    pace.add(1, 1000.0)  # read twice: no pace yet
    assert pace.remaining(60) is None
    pace.add(11, 1005.0)  # 10 steps in 5 s
    assert pace.remaining(61) == 25.0
    assert pace.remaining(None) is None
    assert pace.remaining(5) == 0.0  # past the plan (a resumed job): nothing left, not negative


def test_the_total_is_the_recipes_steps_decision() -> None:
    job = {"decisions": [{"name": "n_epochs", "value": 3}, {"name": "steps", "value": 36}]}
    assert total_steps(job) == 36
    assert total_steps({"decisions": []}) is None


def test_an_event_line_shows_its_own_fields_not_its_envelope() -> None:
    event = DatasetBuilt(
        tenant="acme",
        dataset_id="ds_1",
        dataset_version="v9",
        uri="s3://b/d",
        train_count=12,
        eval_count=4,
    )
    payload = json.loads(event.model_dump_json())
    shown = line(event.subject, payload)
    assert shown.startswith(
        f"{payload['occurred_at'][11:19]}  acme  dataset.built  dataset_id=ds_1 "
    )
    assert "train_count=12 eval_count=4" in shown
    assert event.event_id not in shown


def test_tail_filters_by_event_name_and_leaves_heartbeats_out() -> None:
    assert name_of("tuneloop.acme.deadletter.job.queued.v1") == ("acme", "deadletter.job.queued")
    jobs_only = Tail(["job.*"], None, as_json=False, system=False)
    assert jobs_only.wanted("tuneloop.acme.job.progress.v1")
    assert not jobs_only.wanted("tuneloop.acme.dataset.built.v1")
    everything = Tail([], None, as_json=False, system=False)
    assert everything.wanted("tuneloop.acme.deployment.ready.v2")
    assert not everything.wanted("tuneloop._system.service.heartbeat.v1")
    assert Tail([], None, as_json=False, system=True).wanted(
        "tuneloop._system.service.heartbeat.v1"
    )


def test_nothing_at_the_base_url_is_one_line_and_exit_3() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    env = {"TUNELOOP_BASE_URL": url, "TUNELOOP_API_KEY": "tl_test"}
    result = CliRunner().invoke(app, ["jobs", "list"], env=env)
    assert result.exit_code == 3
    assert result.stderr.startswith(f"error: cannot reach the gateway at {url[:-3]} (")
    assert result.stderr.endswith("; is the stack up?\n")
    assert result.stderr.count("\n") == 1
    assert result.stdout == ""


def test_no_api_key_is_a_usage_error_naming_both_ways_to_give_one() -> None:
    result = CliRunner().invoke(app, ["models", "list"], env={"TUNELOOP_API_KEY": ""})
    assert result.exit_code == 2
    assert "--api-key" in result.stderr
    assert "TUNELOOP_API_KEY" in result.stderr


def test_events_tail_refuses_a_tenant_that_is_not_one() -> None:
    result = CliRunner().invoke(app, ["events", "tail", "--tenant", "a.b"])
    assert result.exit_code == 2
    assert result.stderr == "error: --tenant: 'a.b' is not a tenant id (or '*')\n"
