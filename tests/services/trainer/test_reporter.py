"""The webhook reporter against a real local HTTP receiver that verifies every signature.

Proves: reports sent while the endpoint is down arrive in order once it is up; every attempt is
signed afresh (the receiver's nonce store would refuse a reused nonce); transient statuses and
timeouts are retried, other 4xx drop only that report; a full buffer drops the oldest progress
reports and nothing else; close() gives up within its bound; the secret never reaches a log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pydantic import SecretStr

from services.trainer.config import JobConfig, WebhookSettings
from services.trainer.reporter import (
    NullReporter,
    ReportStamper,
    WebhookReporter,
    make_reporter,
)
from shared.reports import TrainerReport, parse_report
from shared.signing import SIGNATURE_HEADER, MemoryNonceStore, SignatureError, verify
from tests.plugins.infra import free_port
from tests.plugins.waiting import until

SECRET = "whsec-test-7c1e9f"


class Receiver:
    """The scheduler's side, minimal: verify, parse, answer as planned, record what it accepted."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.accepted: list[TrainerReport] = []
        self.bad_signatures: list[str] = []
        self.seen_signatures: list[str] = []
        # report_id -> statuses to answer, one per request, before the default 204.
        self.plan: dict[str, list[int]] = {}
        # report_ids whose first request is answered only after `slow_s` (after the client timed out).
        self.slow: set[str] = set()
        self.slow_s = 0.0
        self._nonces = MemoryNonceStore()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def handle(self, headers: dict[str, str], body: bytes) -> int:
        try:
            verify(headers, body, SECRET, nonce_store=self._nonces)
        except SignatureError as exc:
            self.bad_signatures.append(str(exc))
            return 401
        report = parse_report(body)
        with self._lock:
            self.seen_signatures.append(headers[SIGNATURE_HEADER])
            planned = self.plan.get(report.report_id)
            if planned:
                return planned.pop(0)
            slow = report.report_id in self.slow
            self.slow.discard(report.report_id)
            self.accepted.append(report)
        if slow:
            time.sleep(self.slow_s)
        return 204

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status = receiver.handle(dict(self.headers.items()), body)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def accepted_ids(self) -> list[str]:
        """report_ids in order of first acceptance (the receiver's dedupe by report_id)."""
        return list(dict.fromkeys(report.report_id for report in self.accepted))


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A receiver on a free port, not yet started: the endpoint is down until the test starts it."""
    instance = Receiver(free_port())
    yield instance
    instance.stop()


@pytest.fixture
def make_reporter_for(receiver: Receiver) -> Iterator[Callable[..., WebhookReporter]]:
    made: list[WebhookReporter] = []

    def make(**settings: object) -> WebhookReporter:
        webhook = WebhookSettings(
            url=f"http://127.0.0.1:{receiver.port}/v1/trainer/reports?token=abc",
            secret=SecretStr(SECRET),
            **settings,  # type: ignore[arg-type]
        )
        reporter = WebhookReporter(webhook, backoff_initial_s=0.05, backoff_max_s=0.3)
        made.append(reporter)
        return reporter

    yield make
    for reporter in made:
        reporter.close(timeout_s=1)


STAMP = ReportStamper(job_id="job-1", attempt_id="attempt-1", tenant="acme")


def _progress(step: int) -> TrainerReport:
    return STAMP.progress(step=step, epoch=0.1 * step, loss=2.0 / step, learning_rate=1e-4)


def _run_reports() -> list[TrainerReport]:
    return [
        STAMP.started(world_size=1, total_steps=4, device="cpu", method="lora"),
        _progress(1),
        _progress(2),
        STAMP.checkpoint_saved(
            step=2, uri="s3://b/run/checkpoints/step-00000002", metrics={"loss": 1.0}
        ),
        _progress(3),
        STAMP.completed(artifact_uri="s3://b/run/final", steps=3, metrics={"loss": 0.6}),
    ]


def test_reports_sent_while_down_arrive_in_order_once_the_endpoint_is_up(
    receiver: Receiver, make_reporter_for: Callable[..., WebhookReporter]
) -> None:
    reporter = make_reporter_for()
    reports = _run_reports()
    for report in reports:
        reporter.send(report)
    # It really was down.
    until("two failed attempts", lambda: reporter.stats().failed_attempts >= 2, 30)

    receiver.start()

    assert reporter.close(timeout_s=30) is True
    assert receiver.accepted_ids() == [report.report_id for report in reports]
    assert receiver.accepted == reports  # the bodies parse back to exactly what was sent
    assert receiver.bad_signatures == []
    assert reporter.stats().delivered == len(reports)


def test_transient_statuses_are_retried_with_a_fresh_signature_each_time(
    receiver: Receiver, make_reporter_for: Callable[..., WebhookReporter]
) -> None:
    reports = _run_reports()
    receiver.plan[reports[0].report_id] = [503, 429, 408, 500]
    receiver.start()
    reporter = make_reporter_for()

    for report in reports:
        reporter.send(report)

    assert reporter.close(timeout_s=30) is True
    assert receiver.accepted_ids() == [report.report_id for report in reports]
    # Five requests of the first report, each verified: a reused nonce would have been a 401.
    assert receiver.bad_signatures == []
    assert len(set(receiver.seen_signatures)) == len(receiver.seen_signatures) == len(reports) + 4


def test_a_timed_out_request_is_resent_and_deduplicated_by_report_id(
    receiver: Receiver, make_reporter_for: Callable[..., WebhookReporter]
) -> None:
    reports = _run_reports()
    receiver.slow, receiver.slow_s = {reports[1].report_id}, 1.5
    receiver.start()
    reporter = make_reporter_for(timeout_s=0.3)

    for report in reports:
        reporter.send(report)

    assert reporter.close(timeout_s=30) is True
    assert receiver.accepted_ids() == [report.report_id for report in reports]
    slow_id = reports[1].report_id
    assert [r.report_id for r in receiver.accepted].count(slow_id) >= 2  # it arrived twice
    assert reporter.stats().failed_attempts >= 1


def test_a_4xx_drops_only_that_report_and_says_so_without_the_secret(
    receiver: Receiver,
    make_reporter_for: Callable[..., WebhookReporter],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    reports = _run_reports()
    refused = reports[2]
    receiver.plan[refused.report_id] = [422]
    receiver.start()
    reporter = make_reporter_for()

    for report in reports:
        reporter.send(report)

    assert reporter.close(timeout_s=30) is False  # one report was not delivered
    assert receiver.accepted_ids() == [r.report_id for r in reports if r is not refused]
    assert reporter.stats().rejected == 1
    assert f"refused progress report seq={refused.seq}" in caplog.text
    assert "HTTP 422" in caplog.text
    assert SECRET not in caplog.text
    assert not any(signature in caplog.text for signature in receiver.seen_signatures)
    # The query may carry a token: our lines leave it out (httpx's own go through shared.logs).
    ours = [r.getMessage() for r in caplog.records if r.name == "services.trainer.reporter"]
    assert ours
    assert not any("token=abc" in line for line in ours)


def test_a_full_buffer_drops_the_oldest_progress_reports_only(
    receiver: Receiver, make_reporter_for: Callable[..., WebhookReporter]
) -> None:
    reporter = make_reporter_for(max_buffered=4)
    started = STAMP.started(world_size=1, device="cpu", method="full")
    reporter.send(started)
    until("a failed attempt", lambda: reporter.stats().failed_attempts >= 1, 30)
    p1, p2, p3, p4, p5, p6 = (_progress(step) for step in range(1, 7))
    saved = STAMP.checkpoint_saved(step=4, uri="/out/checkpoints/step-00000004")
    failed = STAMP.failed(reason="nan_loss", message="loss is nan", last_checkpoint_uri=saved.uri)
    # Buffer of 4: each send beyond it drops the oldest queued progress report.
    for report in (p1, p2, p3, p4, saved, p5, p6, failed):
        reporter.send(report)

    receiver.start()

    assert reporter.close(timeout_s=30) is False
    assert receiver.accepted_ids() == [r.report_id for r in (started, saved, p6, failed)]
    assert reporter.stats().dropped == 5


# A close that retried forever would hang here: the test's timeout, not a timed assertion,
# is what catches it.
@pytest.mark.timeout(60)
def test_close_with_the_endpoint_down_returns_false_within_its_bound(
    make_reporter_for: Callable[..., WebhookReporter],
) -> None:
    reporter = make_reporter_for()
    for report in _run_reports():
        reporter.send(report)

    delivered = reporter.close(timeout_s=1.0)

    assert delivered is False
    assert reporter.stats().pending == len(_run_reports())


def test_send_never_raises(make_reporter_for: Callable[..., WebhookReporter]) -> None:
    reporter = make_reporter_for()
    reporter.send(object())  # type: ignore[arg-type]
    reporter.close(timeout_s=0.5)
    reporter.send(_progress(1))  # after close: dropped and logged

    assert reporter.stats().dropped == 1


def _config(**fields: object) -> JobConfig:
    return JobConfig.model_validate(
        {
            "job_id": "job-1",
            "tenant": "acme",
            "base_model": "/m",
            "dataset": "/d",
            "output": {"prefix": "/o"},
            **fields,
        }
    )


def test_make_reporter_follows_the_config(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    null = make_reporter(_config())
    webhook = make_reporter(_config(webhook={"url": "http://127.0.0.1:9/x", "secret": SECRET}))
    report = ReportStamper.for_job(_config()).failed(
        reason="bad_dataset", message="line 3: no messages"
    )

    null.send(report)

    assert isinstance(null, NullReporter)
    assert isinstance(webhook, WebhookReporter)
    assert null.close() is True
    assert webhook.close(timeout_s=0.1) is True  # nothing was sent through it
    assert report.report_id in caplog.text
    assert "line 3: no messages" in caplog.text


def test_the_stamper_numbers_reports_of_an_attempt() -> None:
    stamper = ReportStamper(job_id="job-2", attempt_id="attempt-3", tenant="acme")

    reports = [
        stamper.started(world_size=2, device="cpu", method="lora"),
        _progress_of(stamper),
        _progress_of(stamper),
    ]

    assert [r.seq for r in reports] == [0, 1, 2]
    assert {(r.job_id, r.attempt_id, r.tenant) for r in reports} == {("job-2", "attempt-3", "acme")}
    assert len({r.report_id for r in reports}) == 3


def _progress_of(stamper: ReportStamper) -> TrainerReport:
    return stamper.progress(step=1, epoch=0.0, loss=1.0, learning_rate=1e-3)
