"""deploy/prometheus: the alert rules pass `promtool check rules`, the Prometheus config
`promtool check config`, and the unit tests (`promtool test rules`) fire every alert on a
synthetic series; every metric the rules read is one a service exports on /metrics (the
scheduler's, ingest's), so a renamed metric fails here rather than leaving an alert that can
never fire.

promtool comes from Debian's prometheus package (`make promtool`, which `make test` runs).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY, generate_latest

from services.ingest.capture import spill_watch
from services.scheduler.notifications import metrics
from shared.telemetry import setup_telemetry

PROMETHEUS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
ALERTS = PROMETHEUS / "alerts.yml"
# Metrics Prometheus makes itself, and PromQL words that look like names.
NOT_EXPORTED = {"up", "time", "sum", "max", "by", "increase", "rate", "offset", "or", "and"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    path = shutil.which("promtool")
    assert path is not None, (
        "promtool is missing: `make promtool` installs it (Debian's prometheus)"
    )
    return subprocess.run(
        [path, *args], capture_output=True, text=True, timeout=60, check=False, cwd=PROMETHEUS
    )


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_the_rules_and_the_config_pass_promtools_checks() -> None:
    checked = promtool("check", "rules", "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules())} rules found" in checked.stdout
    config = promtool("check", "config", "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr


def test_every_alert_fires_in_the_unit_tests() -> None:
    tested = promtool("test", "rules", "alerts_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    document = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())
    fired = {
        case["alertname"]
        for test in document["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert fired == {rule["alert"] for rule in rules() if "alert" in rule}


def test_a_unit_test_that_expects_the_wrong_alert_fails(tmp_path: Path) -> None:
    # The check above could not pass by accident: promtool does fail a wrong expectation.
    document = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())
    document["rule_files"] = [str(ALERTS)]
    case = next(c for c in document["tests"][0]["alert_rule_test"] if c.get("exp_alerts"))
    case["exp_alerts"][0]["exp_labels"]["severity"] = "page-everyone"
    wrong = tmp_path / "wrong_test.yml"
    wrong.write_text(yaml.safe_dump(document))
    assert promtool("test", "rules", str(wrong)).returncode != 0


def test_every_scrape_job_is_one_the_service_down_alert_watches() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert jobs == {f"tuneloop-{name}" for name in ("ingest", "scheduler", "evaluator", "hoster")}
    down = next(rule for rule in rules() if rule.get("alert") == "TuneloopServiceDown")
    assert 'job=~"tuneloop-.*"' in down["expr"]


@pytest.fixture
def exported() -> set[str]:
    """The metric names the scheduler's and ingest's processes export (the notifier's, primed
    and observed; the spill watcher's, primed and observed; every service's request metrics),
    as Prometheus' text format names them."""
    app = FastAPI()
    app.add_api_route("/ping", lambda: {"ok": True})
    setup_telemetry("scheduler", app=app)
    assert TestClient(app).get("/ping").status_code == 200  # counted, as every request is
    metrics.prime()
    metrics.set_progress({("acme", "ftjob-1"): 1.0})
    metrics.set_budget({"acme": 0.5})
    spill_watch.prime()
    text = generate_latest(REGISTRY).decode()
    names = set(re.findall(r"^# TYPE (\S+) ", text, flags=re.MULTILINE))
    counters = set(re.findall(r"^# TYPE (\S+) counter", text, flags=re.MULTILINE))
    return names | {f"{name}_total" for name in counters if not name.endswith("_total")}


def test_the_rules_read_only_metrics_the_services_export(exported: set[str]) -> None:
    read = {
        name
        for rule in rules()
        for name in re.findall(r"\b([a-z_][a-z0-9_]*)\s*[{\[(]", rule["expr"])
    }
    read |= {
        name for rule in rules() for name in re.findall(r"\btuneloop_[a-z0-9_]+", rule["expr"])
    }
    assert {"tuneloop_alerts_total", "tuneloop_capture_spill_bytes"} <= read
    assert read - NOT_EXPORTED <= exported, sorted(read - NOT_EXPORTED - exported)
