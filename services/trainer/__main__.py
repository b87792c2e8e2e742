"""`python -m services.trainer run --config job.json [--set key=value ...] [--resume-from URI|latest]`
and `[--resume-fallback URI ...]`: checkpoints tried in turn when the one before cannot be used.

Exit status: 0 when training completed, or stopped by SIGTERM/SIGINT after saving a checkpoint;
2 bad config (the message names the field; also: no checkpoint to resume from verifies), 3 bad
dataset, 4 NaN/inf loss, 5 out of memory, 6 the stop request could not checkpoint within
`checkpoints.sigterm_grace_s`, 1 anything else.
The same command runs under `torchrun --nproc-per-node N` (one process per device).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from services.trainer.config import ConfigError, JobConfig, load_config, with_resume
from services.trainer.loop import TrainingFailed, run_training
from services.trainer.progress import StepMetrics
from shared.logs import configure_logging

log = logging.getLogger("services.trainer")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_BAD_CONFIG = 2
EXIT_BAD_DATASET = 3
EXIT_NAN_LOSS = 4
EXIT_OOM = 5
EXIT_INTERRUPTED = 6
EXIT_CODES = {
    "bad_config": EXIT_BAD_CONFIG,
    "bad_dataset": EXIT_BAD_DATASET,
    "nan_loss": EXIT_NAN_LOSS,
    "oom": EXIT_OOM,
    "interrupted": EXIT_INTERRUPTED,
    "error": EXIT_ERROR,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m services.trainer", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="train as the job config says")
    run.add_argument("--config", required=True, help="the job config (JSON)")
    run.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field by dotted path, e.g. hyperparameters.learning_rate=1e-4",
    )
    run.add_argument("--resume-from", help="a checkpoint URI/path, or 'latest' under output.prefix")
    run.add_argument(
        "--resume-fallback",
        dest="resume_fallbacks",
        action="append",
        default=[],
        metavar="URI",
        help="a checkpoint to resume from when --resume-from's fails its check or is missing "
        "(repeatable, tried in order; the first that verifies is used)",
    )
    run.add_argument(
        "--work-dir",
        help="scratch space for downloads and checkpoint staging (default: a temp dir, removed)",
    )
    run.add_argument(
        "--progress",
        choices=("auto", "on", "off"),
        default="auto",
        help="rich progress bar (auto: only when stderr is a terminal)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    interactive = sys.stderr.isatty()
    configure_logging(
        "trainer", level=os.environ.get("TUNELOOP_LOG_LEVEL", "INFO"), json=not interactive
    )
    try:
        config = load_config(args.config, args.overrides)
        config = with_resume(config, args.resume_from, args.resume_fallbacks)
    except ConfigError as exc:
        log.error("%s", exc)
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    show_progress = args.progress == "on" or (args.progress == "auto" and interactive)
    with _work_dir(args.work_dir) as work_dir, _stop_on_signals(config) as stop:
        return _run(config, work_dir, stop, show_progress)


def _run(config: JobConfig, work_dir: Path, stop: threading.Event, show_progress: bool) -> int:
    with _progress_bar(show_progress and _is_rank0()) as on_step:
        try:
            result = run_training(config, work_dir=work_dir, stop=stop, on_step=on_step)
        except TrainingFailed as exc:
            print(f"error ({exc.reason}): {exc.message}", file=sys.stderr)
            return EXIT_CODES[exc.reason]
    if result.status == "stopped":
        log.info("stopped after step %d; resume with --resume-from latest", result.steps)
    else:
        log.info(
            "completed %d steps",
            result.steps,
            extra={"artifact_uri": result.artifact.uri if result.artifact else None},
        )
    return EXIT_OK


def _is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


@contextmanager
def _work_dir(given: str | None) -> Iterator[Path]:
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix="tuneloop-trainer-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def _stop_on_signals(config: JobConfig) -> Iterator[threading.Event]:
    """SIGTERM/SIGINT set the stop flag: the loop finishes its step, checkpoints and returns.

    A watchdog bounds that: past `sigterm_grace_s` the process exits with EXIT_INTERRUPTED,
    since a provider will SIGKILL it soon anyway and the last committed checkpoint stays valid.
    """
    stop = threading.Event()
    grace_s = config.checkpoints.sigterm_grace_s

    def handle(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():
            return
        stop.set()
        log.warning("signal %d: finishing the step, then checkpointing", signum)
        timer = threading.Timer(grace_s, _give_up, args=(grace_s,))
        timer.daemon = True
        timer.start()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _give_up(grace_s: float) -> None:
    log.error("no checkpoint within sigterm_grace_s=%ss: exiting without one", grace_s)
    logging.shutdown()
    os._exit(EXIT_INTERRUPTED)


@contextmanager
def _progress_bar(enabled: bool) -> Iterator[Callable[[StepMetrics], None] | None]:
    """A rich progress bar fed by the loop's per-step metrics (terminals only)."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("step {task.completed}/{task.total}"),
        BarColumn(),
        TextColumn("loss {task.fields[loss]:.4f}  {task.fields[tps]:.0f} tok/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as progress:
        task = progress.add_task("train", total=None, loss=float("nan"), tps=0.0)

        def on_step(m: StepMetrics) -> None:
            tps = m.tokens / m.seconds if m.seconds > 0 else 0.0
            progress.update(task, completed=m.step, total=m.total_steps, loss=m.loss, tps=tps)

        yield on_step


if __name__ == "__main__":
    sys.exit(main())
