"""The dashboard at /ui in headless Chromium (Debian's, through playwright's executable_path: `make
chromium`), against the real stack of stack.py and a real job on the tiny model: sign-in keeps the
key out of every URL, page, cookie and log; the job page draws its loss and task-score curves
from the job's own points while it runs; each eval item is shown; Deploy deploys on the real
hoster; a read key's Deploy is disabled and refused; a change without the CSRF token, from another
origin or from another site is refused; another tenant sees nothing; sign-out ends the session.
Each test writes PNG screenshots to its tmp dir."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, sync_playwright

from shared.settings import Settings
from tests.plugins.infra import RunningProcess
from tests.plugins.waiting import until
from tests.services.ingest.ui.stack import ITEMS, Stack, running, secret_of

pytestmark = pytest.mark.slow
CHROMIUM = "/usr/bin/chromium"
COOKIE = "tuneloop_session"
# The series' colours in static/job.js.
LOSS, SCORE, BEST = (31, 119, 180), (214, 39, 40), (44, 160, 44)
QUESTIONS = [{"question": f"Ticket {n}", "answer": "billing"} for n in range(4)]
ITEM_SCHEMA = {
    "type": "object",
    "properties": {"question": {"type": "string"}, "answer": {"type": "string"}},
    "required": ["question", "answer"],
}


@pytest.fixture(scope="module")
def stack(
    nats_server: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tiny_stopping_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    with running(
        tmp_path_factory.mktemp("dashboard"), stack_settings, tiny_stopping_model_dir
    ) as s:
        yield s


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if shutil.which("chromium") is None:
        pytest.fail("Debian's chromium is not installed: run `make chromium` (make test does)")
    with sync_playwright() as playwright:
        yield _launch(playwright)


def _launch(playwright: Playwright) -> Browser:
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True)


@pytest.fixture
def visited() -> list[str]:
    """Every URL the test's browser asked for."""
    return []


def _context(browser: Browser, stack: Stack, visited: list[str]) -> BrowserContext:
    context = browser.new_context(base_url=stack.url, viewport={"width": 1280, "height": 900})
    context.on("request", lambda request: visited.append(request.url))
    return context


def _signed_in(browser: Browser, stack: Stack, key: str, visited: list[str]) -> Page:
    page = _context(browser, stack, visited).new_page()
    page.goto("/ui/jobs")
    assert page.url.endswith("/ui/sign-in")  # no session yet
    page.fill("#key", key)
    page.click("#sign-in button")
    page.wait_for_url("**/ui/jobs")
    return page


def _shot(page: Page, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
    assert (tmp_path / f"{name}.png").stat().st_size > 0


def _dataset(stack: Stack) -> dict[str, Any]:
    """The dataset the job's uploaded files became, once built."""

    def built() -> dict[str, Any] | None:
        for dataset in stack.get("/datasets")["data"]:
            if (
                dataset["name"] == f"fine-tuning job {stack.job_id}"
                and dataset["status"] == "built"
            ):
                found: dict[str, Any] = dataset
                return found
        return None

    return until("the job's dataset built", built, 120)


def test_the_job_page_draws_the_jobs_loss_and_task_score_as_it_runs(
    browser: Browser, stack: Stack, visited: list[str], tmp_path: Path
) -> None:
    page = _signed_in(browser, stack, stack.key, visited)
    page.goto(f"/ui/jobs/{stack.job_id}")
    page.evaluate("window.sameDocument = true")
    page.wait_for_selector("#progress[data-state]")
    states = {page.get_attribute("#progress", "data-state")}
    _shot(page, tmp_path, "job-running")
    page.wait_for_selector("#progress[data-state=ended]", timeout=240_000)
    states.add(page.get_attribute("#progress", "data-state"))
    assert page.evaluate("window.sameDocument") is True  # updated in place, never reloaded
    assert states == {"live", "ended"}  # it was drawn while the job ran
    job = stack.job()
    assert job.status == "succeeded", job.error
    assert page.inner_text("#job-status") == "succeeded"
    # The facts the page was served without, filled in as the job went on.
    assert page.inner_text("#fine-tuned-model") == job.fine_tuned_model
    assert page.inner_text("#gate") == job.gate == "passed"
    assert "the job succeeded" in page.inner_text("#events tbody tr:first-child")
    chart = page.evaluate("window.tuneloop.charts.progress.data")
    _shot(page, tmp_path, "job-ended")
    steps, loss, score, best = chart
    losses, scores = _api_points(stack)
    assert len(losses) >= 2
    assert len(scores) >= 2
    evaluated = stack.get(f"/evals/{stack.job_id}")["points"]  # the evaluator's own record
    assert scores == {p["step"]: p["task_score"] for p in evaluated if p["status"] == "scored"}
    drawn_loss = {s: v for s, v in zip(steps, loss, strict=True) if v is not None}
    drawn_score = {s: v for s, v in zip(steps, score, strict=True) if v is not None}
    assert drawn_loss == pytest.approx(losses)
    # Both ways (CI once drew a score the API no longer listed): what each side held, and the
    # job's whole event log, to tell which side was wrong.
    assert drawn_score == pytest.approx(scores), _mismatch(stack, drawn_score, scores, evaluated)
    marked = {s: v for s, v in zip(steps, best, strict=True) if v is not None}
    assert marked == {job.best_step: pytest.approx(scores[job.best_step])}
    assert page.inner_text("#best-step") == str(job.best_step)
    pixels = _pixels(page, "#progress canvas", (LOSS, SCORE, BEST))
    assert min(pixels) > 20, pixels  # each series is on the canvas
    assert "local" in page.inner_text("#attempt-table")  # the attempt's provider
    assert page.evaluate("window.tuneloop.charts.attempts.series.length") == 2


def _api_points(stack: Stack) -> tuple[dict[int, float], dict[int, float]]:
    """The job's training loss per reported step and task score per scored checkpoint, from its
    metrics events as the SDK lists them (newest first: a step's newest value counts)."""
    points: dict[str, dict[int, float]] = {"train_loss": {}, "task_score": {}}
    for event in stack.client.fine_tuning.jobs.list_events(stack.job_id, limit=100):
        data: Any = event.data
        for metric, found in points.items():
            if event.type == "metrics" and data and "step" in data and metric in data:
                found.setdefault(data["step"], data[metric])
    return points["train_loss"], points["task_score"]


def _mismatch(
    stack: Stack, drawn: dict[int, float], listed: dict[int, float], evaluated: list[Any]
) -> str:
    events = [
        (e.created_at, e.id, e.type, e.message, e.data)
        for e in stack.client.fine_tuning.jobs.list_events(stack.job_id, limit=100)
    ]
    return (
        f"drawn {sorted(drawn.items())}\nlisted {sorted(listed.items())}\n"
        f"evaluator {evaluated}\nevents (newest first) {events}"
    )


def _pixels(page: Page, selector: str, colors: tuple[tuple[int, int, int], ...]) -> list[int]:
    """How many pixels of the canvas are (near) each colour."""
    counts: list[int] = page.evaluate(
        """([selector, colors]) => {
            const canvas = document.querySelector(selector);
            const rgba = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
            return colors.map(([r, g, b]) => {
                let n = 0;
                for (let i = 0; i < rgba.length; i += 4) {
                    if (Math.abs(rgba[i] - r) + Math.abs(rgba[i + 1] - g) + Math.abs(rgba[i + 2] - b) < 40
                        && rgba[i + 3] > 200) n++;
                }
                return n;
            });
        }""",
        [selector, [list(c) for c in colors]],
    )
    return counts


def test_sign_in_keeps_the_key_out_of_urls_pages_and_cookies(
    browser: Browser, stack: Stack, visited: list[str], tmp_path: Path
) -> None:
    dataset = _dataset(stack)
    page = _signed_in(browser, stack, stack.key, visited)
    pages = [page.content()]
    assert stack.job_id in page.inner_text("main")
    assert stack.tenant in page.inner_text("#who")
    page.click("nav >> text=Datasets")
    page.click(f"text={dataset['id']}")  # the job's dataset, built from the uploaded files
    page.wait_for_url(f"**/ui/datasets/{dataset['id']}")
    steps = page.locator("#cleaning tbody tr")
    assert steps.count() == len(dataset["report"]["steps"]) > 0
    assert str(dataset["report"]["input_count"]) in page.inner_text("main")
    assert "train" in page.inner_text("#stats")
    pages.append(page.content())
    _shot(page, tmp_path, "dataset")
    for path in ("/ui/models", f"/ui/jobs/{stack.job_id}"):
        page.goto(path)
        pages.append(page.content())
    secret = secret_of(stack.key)
    assert not [url for url in visited if secret in url]
    assert not [html for html in pages if secret in html]
    (cookie,) = [c for c in page.context.cookies() if c["name"] == COOKIE]
    assert secret not in cookie["value"]
    assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (True, "Strict", "/ui")
    assert page.evaluate("document.cookie") == ""  # no script can read it


def test_a_wrong_key_is_refused_without_being_shown_back(
    browser: Browser, stack: Stack, visited: list[str]
) -> None:
    page = _context(browser, stack, visited).new_page()
    page.goto("/ui/sign-in")
    wrong = "tl_zzzzzzzz_" + "A" * 43
    for key, reason in ((wrong, "not recognised"), ("not-a-key", "malformed")):
        page.fill("#key", key)
        with page.expect_navigation() as posted:
            page.click("#sign-in button")
        assert posted.value is not None
        assert posted.value.status == 401
        assert reason in page.inner_text("#error")
        assert key not in page.content()
    assert not [c for c in page.context.cookies() if c["name"] == COOKIE]
    forged = page.request.post(
        "/ui/sign-in", form={"key": stack.key}, headers={"Origin": stack.url}
    )  # no sign-in token: another site cannot sign this browser in
    assert forged.status == 403
    assert "CSRF token" in forged.text()


def test_the_evaluation_page_shows_each_item(
    browser: Browser, stack: Stack, visited: list[str], tmp_path: Path
) -> None:
    job = until("the job's end", lambda: j if (j := stack.job()).finished_at else None, 240)
    items = stack.get(f"/evals/{stack.job_id}/points/{job.best_step}/items")["data"]
    assert len(items) == ITEMS
    page = _signed_in(browser, stack, stack.key, visited)
    page.goto(f"/ui/jobs/{stack.job_id}/evaluation")  # the best step's items first
    assert f"Items at step {job.best_step}" in page.inner_text("main")
    rows = page.locator("#items tbody tr")
    assert rows.count() == ITEMS
    for n, item in enumerate(items):
        cells = rows.nth(n).locator("td")
        question = item["input"]["messages"][-1]["content"]
        assert question in cells.nth(1).inner_text()  # input
        assert cells.nth(2).inner_text().startswith(item["output"]["text"].strip())  # output
        assert cells.nth(3).inner_text() == item["reference"]["text"]  # reference
        assert cells.nth(4).inner_text() == f"{item['score']:.3f}"  # score
    _shot(page, tmp_path, "evaluation")


def _version(stack: Stack) -> str:
    job = until("the job's version", lambda: j if (j := stack.job()).fine_tuned_model else None)
    return str(job.fine_tuned_model)


def test_a_read_key_sees_deploy_disabled_and_is_refused_if_it_presses_it(
    browser: Browser, stack: Stack, visited: list[str], tmp_path: Path
) -> None:
    model = _version(stack)
    page = _signed_in(browser, stack, stack.read_key, visited)
    page.goto("/ui/models")
    button = page.locator(f'tr[data-model="{model}"] button')
    assert button.is_disabled()
    assert page.is_visible("#read-only")
    _shot(page, tmp_path, "models-read-only")
    with page.expect_navigation() as pressed:  # pressed anyway, the button's disabling undone
        page.evaluate(
            "m => document.querySelector(`tr[data-model='${m}'] form`).requestSubmit()", model
        )
    response = pressed.value
    assert response is not None
    assert response.status == 403
    assert "scope 'read'" in page.inner_text("#error")
    assert stack.get("/deployments")["data"] == []


def test_changes_without_the_csrf_token_or_from_elsewhere_are_refused(
    browser: Browser, stack: Stack, visited: list[str]
) -> None:
    model = _version(stack)
    page = _signed_in(browser, stack, stack.key, visited)
    page.goto("/ui/models")
    token = page.get_attribute("form.deploy input[name=csrf]", "value")
    own = {"Origin": stack.url}
    refused = {
        "CSRF token": page.request.post("/ui/deployments", form={"model": model}, headers=own),
        "came from": page.request.post(
            "/ui/deployments",
            form={"model": model, "csrf": str(token)},
            headers={"Origin": "http://attacker.example"},
        ),
    }
    for reason, answer in refused.items():
        assert answer.status == 403, reason
        assert reason in answer.text()
    # A page of another site posting the form: the browser sends no SameSite=Strict cookie.
    other = page.context.new_page()
    other.set_content(
        f'<form method="post" action="{stack.url}/ui/deployments"><input name="model" '
        f'value="{model}"></form>'
    )
    with other.expect_navigation() as posted:
        other.evaluate("document.forms[0].submit()")
    assert posted.value is not None
    assert posted.value.status == 401
    assert stack.get("/deployments")["data"] == []


def test_deploy_deploys_the_jobs_version_on_the_hoster(
    browser: Browser, stack: Stack, visited: list[str], tmp_path: Path
) -> None:
    model = _version(stack)
    page = _signed_in(browser, stack, stack.key, visited)
    page.goto("/ui/models")
    page.click(f'tr[data-model="{model}"] button')
    page.wait_for_url("**/ui/models?deployed=*")
    assert "is starting" in page.inner_text("#notice")
    (deployment,) = stack.get("/deployments")["data"]
    assert deployment["model"] == model
    ready = until(
        "the deployment ready",
        lambda: d if (d := stack.get(f"/deployments/{deployment['id']}"))["status"] == "ready"
        else None,
    )  # fmt: skip
    assert ready["error"] is None
    page.reload()
    row = page.inner_text(f'tr[data-deployment="{deployment["id"]}"]')
    assert "ready" in row
    assert model in row
    _shot(page, tmp_path, "deployed")


def _jsonl_run(stack: Stack, eval_id: str, name: str, answers: list[str]) -> str:
    """A run of given answers (no model called), once completed."""
    rows = [
        {"item": item, "sample": {"output_text": answer}}
        for item, answer in zip(QUESTIONS, answers, strict=True)
    ]
    run = stack.client.evals.runs.create(
        eval_id,
        name=name,
        data_source={"type": "jsonl", "source": {"type": "file_content", "content": rows}},
    )
    until(
        f"run {name} completed",
        lambda: (
            True
            if stack.client.evals.runs.retrieve(run.id, eval_id=eval_id).status == "completed"
            else None
        ),
        60,
    )
    return run.id


def test_the_comparison_page_shows_two_runs_side_by_side(
    browser: Browser, stack: Stack, visited: list[str], tmp_path: Path
) -> None:
    created = stack.client.evals.create(
        name="labels",
        data_source_config={
            "type": "custom",
            "item_schema": ITEM_SCHEMA,
            "include_sample_schema": True,
        },
        testing_criteria=[
            {
                "type": "string_check",
                "name": "exact",
                "input": "{{sample.output_text}}",
                "reference": "{{item.answer}}",
                "operation": "eq",
            },
        ],
    )
    base = _jsonl_run(stack, created.id, "before", ["billing", "billing", "billing", "oops"])
    candidate = _jsonl_run(stack, created.id, "after", ["nope", "billing", "billing", "billing"])
    page = _signed_in(browser, stack, stack.key, visited)
    page.click("nav >> text=Compare runs")
    page.select_option("select[name=eval_id]", created.id)
    page.click("form.picker button")
    page.select_option("select[name=base]", base)
    page.select_option("select[name=candidate]", candidate)
    page.click("form.picker button")
    page.wait_for_selector("#compared")
    found = stack.client.get(
        f"/evals/{created.id}/compare",
        cast_to=dict[str, Any],
        options={"params": {"base": base, "candidate": candidate}},
    )
    assert found["counts"] == {"regressed": 1, "errored": 0, "unchanged": 2, "improved": 1}
    rows = page.locator("#compared tbody tr")
    assert [rows.nth(n).locator("td").nth(1).inner_text() for n in range(rows.count())] == [
        item["change"] for item in found["data"]
    ]
    assert "1 regressed, 0 errored, 2 unchanged, 1 improved" in page.inner_text("main")
    assert "nope" in rows.first.inner_text()  # the regression first, with the candidate's answer
    _shot(page, tmp_path, "compare")


def test_another_tenant_sees_none_of_it(browser: Browser, stack: Stack, visited: list[str]) -> None:
    page = _signed_in(browser, stack, stack.other_key, visited)
    assert stack.job_id not in page.inner_text("main")
    answer = page.goto(f"/ui/jobs/{stack.job_id}")
    assert answer is not None
    assert answer.status == 404
    poll = page.request.get(
        f"/ui/jobs/{stack.job_id}/progress", headers={"Accept": "application/json"}
    )
    assert poll.status == 404


def test_sign_out_ends_the_session_on_the_server(
    browser: Browser, stack: Stack, visited: list[str]
) -> None:
    page = _signed_in(browser, stack, stack.key, visited)
    (cookie,) = [c for c in page.context.cookies() if c["name"] == COOKIE]
    page.click("#sign-out")
    page.wait_for_url("**/ui/sign-in")
    replayed = _context(browser, stack, visited)
    # The cookie as it was, in another browser.
    replayed.add_cookies([{"name": COOKIE, "value": cookie["value"], "url": f"{stack.url}/ui"}])
    again = replayed.new_page()
    again.goto("/ui/jobs")
    assert again.url.endswith("/ui/sign-in")
