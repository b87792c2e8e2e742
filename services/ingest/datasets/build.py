"""One dataset build, start to end: select samples -> hold out the eval sets' -> clean -> split
-> decontaminate -> snapshot, and the separate process it runs in.

`build` is the pipeline as plain synchronous code. `run_isolated` runs it in a child process
(`python -m services.ingest.datasets.build`): a build is seconds to minutes of CPU-bound Python,
which in the service's own process would hold the GIL away from the gateway's event loop. The
child reads its job as one JSON line on stdin, reports each step as a JSON line on stdout and
waits for a `go` line before going on (so the parent records progress and notices a lost
claim), and ends with the outcome. A child whose parent died reads EOF at its next step and
exits.
"""

from __future__ import annotations

import gc
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import IO, Any

import orjson
from sqlalchemy.engine import Engine
from sqlmodel import Session

from services.ingest.datasets import select as dataset_select
from services.ingest.datasets.cleaning.pipeline import clean_and_split
from services.ingest.datasets.cleaning.report import StepReport
from services.ingest.datasets.cleaning.tokens import (
    TokenCounter,
    TokenizerLoadError,
    load_tokenizer,
)
from services.ingest.datasets.rows import Built
from services.ingest.datasets.snapshots import write_snapshot
from services.ingest.datasets.spec import DatasetSpec
from services.ingest.datasets.split import SplitError
from services.ingest.eval_sets import store as eval_sets
from services.ingest.samples.feedback import store as feedback
from shared import catalogue
from shared.catalogue import CatalogueError
from shared.chat import Sample
from shared.db import make_engine
from shared.settings import S3Settings, get_settings
from shared.storage import ObjectStore

log = logging.getLogger("tuneloop.ingest.dataset_build")


class BuildFailed(Exception):
    """The build cannot succeed with these inputs (empty selection, eval larger than the data,
    ...); the message names the problem. Ends the dataset `failed`; retrying would not help."""


class NotYet(Exception):
    """The inputs are not all there yet (an upload's samples still on their way to the store);
    the build is handed back and the event redelivered later."""


@dataclass(frozen=True)
class StepProgress:
    step: str
    samples_in: int
    samples_out: int
    removed: int = 0
    changed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "samples_in": self.samples_in,
            "samples_out": self.samples_out,
            "removed": self.removed,
            "changed": self.changed,
        }


OnStep = Callable[[StepProgress], None]


# --- the pipeline -----------------------------------------------------------------------------


def select_samples(
    engine: Engine, *, tenant: str, spec: DatasetSpec, file_wait_s: float
) -> tuple[list[Sample], list[Sample] | None]:
    """The spec's samples, oldest first: (train candidates, eval) where eval is the eval
    files' samples, or None when the spec has none (the split then makes eval). Candidates are
    the filter's and the files' (without repeats, nor the eval files' samples)."""
    evaluation: list[Sample] | None = None
    if spec.eval_file_ids:
        files = _files_in_store(
            engine, tenant=tenant, field="eval_file_ids", ids=spec.eval_file_ids, wait_s=file_wait_s
        )
        evaluation = list(dataset_select.iter_files(engine, tenant=tenant, files=files))
    in_eval = {sample.id for sample in evaluation or ()}
    picked: dict[str, Sample] = {}
    if spec.source is not None:
        for sample in dataset_select.iter_filtered(engine, tenant=tenant, selection=spec.source):
            picked[sample.id] = sample
    if spec.file_ids:
        files = _files_in_store(
            engine, tenant=tenant, field="file_ids", ids=spec.file_ids, wait_s=file_wait_s
        )
        for sample in dataset_select.iter_files(engine, tenant=tenant, files=files):
            picked.setdefault(sample.id, sample)
    # A filter may also match the eval files' uploads: they are eval, never train.
    return [s for s in picked.values() if s.id not in in_eval], evaluation


def _files_in_store(
    engine: Engine, *, tenant: str, field: str, ids: list[str], wait_s: float
) -> list[dataset_select.FileSelection]:
    """The files once every sample their import made is stored. An import publishes its
    samples and the persister stores them a moment later; a build started in between would
    silently miss some, so it waits, then hands the build back (NotYet)."""
    with Session(engine) as session:
        try:
            files = dataset_select.check_files(
                session, tenant=tenant, file_ids=ids, field_name=field
            )
        except dataset_select.SelectionError as exc:
            raise BuildFailed(str(exc)) from None
    expected = sum(f.samples for f in files)
    deadline = time.monotonic() + wait_s
    while (stored := dataset_select.count_files(engine, tenant=tenant, files=files)) < expected:
        if time.monotonic() >= deadline:
            raise NotYet(f"{field}: {stored} of the files' {expected} samples are stored so far")
        time.sleep(0.5)
    return files


def _base_model_location(spec: DatasetSpec) -> str | None:
    """Where the base model named by the spec (checked when the request came in) is read."""
    if spec.base_model is None:
        return None
    return catalogue.locate(spec.base_model, data_dir=get_settings().app.data_dir)


def _feedback_scores(engine: Engine, *, tenant: str, spec: DatasetSpec) -> dict[str, float] | None:
    """Each sample's newest feedback score, read once for the whole build, when rejection
    sampling will read it (`min_score` under the key `score`: cleaning.scoring)."""
    cleaning = spec.cleaning
    if cleaning.min_score is None or cleaning.score_key != feedback.SCORE_KEY:
        return None
    return feedback.newest_scores(engine, tenant=tenant)


def build(
    engine: Engine,
    store: ObjectStore,
    *,
    tenant: str,
    spec: DatasetSpec,
    on_step: OnStep,
    file_wait_s: float = 60.0,
) -> Built:
    """Run the whole build; raises BuildFailed with a message naming the problem."""
    samples, given_eval = select_samples(engine, tenant=tenant, spec=spec, file_wait_s=file_wait_s)
    if not samples:
        raise BuildFailed("empty selection: no samples match the dataset's source and file_ids")
    if given_eval is not None and not given_eval:
        raise BuildFailed("eval_file_ids: the eval files hold no samples")
    selected = len(samples) + len(given_eval or ())
    on_step(StepProgress("select", selected, selected))
    # What the tenant's eval sets hold never trains (eval files stay the eval split as given).
    candidates, held_out = eval_sets.hold_out(
        engine, tenant=tenant, samples=samples, samples_in=selected
    )
    on_step(StepProgress(held_out.step, selected, held_out.samples_out, held_out.removed))
    if not candidates:
        raise BuildFailed(
            f"{eval_sets.HOLDOUT_STEP}: all {len(samples)} samples selected for training are "
            "held by the tenant's eval sets"
        )
    try:
        # One counter for cleaning and stats: its cache of token counts serves both.
        counter = TokenCounter.of(load_tokenizer(_base_model_location(spec), store))
    except (TokenizerLoadError, CatalogueError) as exc:
        raise BuildFailed(str(exc)) from None

    def cleaned_step(report: StepReport) -> None:
        on_step(
            StepProgress(
                report.step, report.samples_in, report.samples_out, report.removed, report.changed
            )
        )

    try:
        train, evaluation, report = clean_and_split(
            candidates,
            spec.cleaning,
            spec.split,
            eval_samples=given_eval,
            tokenizer=counter,
            on_step=cleaned_step,
            feedback_scores=_feedback_scores(engine, tenant=tenant, spec=spec),
        )
    except SplitError as exc:
        raise BuildFailed(str(exc)) from None
    # The hold-out is the report's first step, so its counts add up from the selection.
    report.steps.insert(0, held_out)
    report.input_count += held_out.removed
    kept = len(train) + len(evaluation)
    lineage = {
        "file_ids": list(spec.file_ids),
        "eval_file_ids": list(spec.eval_file_ids),
        "selected_ids": sorted(s.id for s in [*samples, *(given_eval or ())]),
    }
    snapshot = write_snapshot(
        store,
        tenant=tenant,
        train=train,
        eval=evaluation,
        report=report,
        spec=spec,
        lineage=lineage,
        tokenizer=counter,
    )
    on_step(StepProgress("snapshot", kept, snapshot.train_count + snapshot.eval_count))
    return Built(
        version=snapshot.version,
        uri=snapshot.uri,
        train_count=snapshot.train_count,
        eval_count=snapshot.eval_count,
        stats=dict(snapshot.stats),
        report=report.to_dict(),
    )


# --- the child process ------------------------------------------------------------------------


class BuildCrashed(RuntimeError):
    """The build process died or broke (a bug, out of memory); the build is retried."""


@dataclass(frozen=True)
class BuildJob:
    """What the child needs; it travels on the child's stdin, never in argv or the environment
    (it holds the database URL's password and the S3 secret)."""

    database_url: str
    s3: dict[str, Any]
    tenant: str
    spec: dict[str, Any]
    file_wait_s: float

    @classmethod
    def of(
        cls, engine: Engine, s3: S3Settings, *, tenant: str, spec: DatasetSpec, file_wait_s: float
    ) -> BuildJob:
        return cls(
            database_url=engine.url.render_as_string(hide_password=False),
            s3=s3.model_dump(mode="json") | {"secret_key": s3.secret_key.get_secret_value()},
            tenant=tenant,
            spec=spec.model_dump(mode="json"),
            file_wait_s=file_wait_s,
        )


def _send(out: IO[bytes], kind: str, payload: Any) -> None:
    out.write(orjson.dumps({kind: payload}) + b"\n")
    out.flush()


def run_isolated(
    job: BuildJob,
    on_step: OnStep,
    *,
    on_start: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> Built:
    """Run `build` for `job` in a child process; raises what `build` would (BuildFailed,
    NotYet), BuildCrashed when the child dies, and whatever `on_step` raises (the child is
    killed then). `on_start` gets the child, so a caller can kill it from another thread."""
    child = subprocess.Popen(
        [sys.executable, "-m", "services.ingest.datasets.build"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    if on_start is not None:
        on_start(child)
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        _send(child.stdin, "job", asdict(job))
        for line in child.stdout:
            message = orjson.loads(line)
            if "step" in message:
                on_step(StepProgress(**message["step"]))
                child.stdin.write(b"go\n")
                child.stdin.flush()
            elif "built" in message:
                return Built(**message["built"])
            elif "failed" in message:
                raise BuildFailed(message["failed"])
            elif "not_yet" in message:
                raise NotYet(message["not_yet"])
            else:
                raise BuildCrashed(message.get("error", "unknown message from the build"))
        raise BuildCrashed(f"the build process exited with status {child.wait()}")
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        child.stdin.close()
        child.stdout.close()


def _child_main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    out, commands = sys.stdout.buffer, sys.stdin.buffer
    job = BuildJob(**orjson.loads(commands.readline())["job"])
    engine = make_engine(job.database_url)
    store = ObjectStore.from_settings(S3Settings(**job.s3))

    # A build makes hundreds of thousands of long-lived objects (samples, their copies, token
    # counts) and little cyclic garbage; with the collector on, each full collection rescans
    # them all (the selection alone took 3x longer). The process is short-lived: off.
    gc.disable()

    def on_step(progress: StepProgress) -> None:
        _send(out, "step", progress.to_dict())
        if commands.readline().strip() != b"go":
            raise SystemExit(0)  # the parent is gone or gave up: stop here

    try:
        spec = DatasetSpec.model_validate(job.spec)
        built = build(
            engine,
            store,
            tenant=job.tenant,
            spec=spec,
            on_step=on_step,
            file_wait_s=job.file_wait_s,
        )
        _send(out, "built", asdict(built))
    except BuildFailed as exc:
        _send(out, "failed", str(exc))
    except NotYet as exc:
        _send(out, "not_yet", str(exc))
    except Exception as exc:
        log.exception("dataset build crashed")
        _send(out, "error", f"{type(exc).__name__}: {exc}")
    finally:
        engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(_child_main())
