"""The gateway benchmark's tables: absolute numbers, ratios against LiteLLM, and the goals."""

from __future__ import annotations

from statistics import median
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from tests.benchmarks.wrk import WrkResult

if TYPE_CHECKING:
    from tests.benchmarks.bench_gateway import Results

GOAL_P50_MS, GOAL_P99_MS, GOAL_RATE, GOAL_THROUGHPUT_X = 1.0, 5.0, 1000.0, 15.0
PASS, FAIL = "[green]✓ met", "[red]✗ missed"


def _added_in(runs: dict[str, WrkResult], name: str) -> tuple[float, float] | None:
    """What `name` adds to the direct path's p50 and p99 in one round."""
    if name not in runs or "direct" not in runs:
        return None
    direct, path = runs["direct"], runs[name]
    return path.p50_ms - direct.p50_ms, path.p99_ms - direct.p99_ms


def _added(results: Results, rate: float, name: str) -> tuple[float, float] | None:
    """The median over rounds of the added p50, and of the added p99."""
    rounds = [a for runs in results.fixed.get(rate, []) if (a := _added_in(runs, name))]
    if not rounds:
        return None
    return median(a[0] for a in rounds), median(a[1] for a in rounds)


def _rate(rate: float) -> str:
    return "1 conn" if rate == 0 else f"{rate:g}/s"


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _errors(result: WrkResult) -> str:
    parts = [
        f"{n} {what}"
        for n, what in (
            (result.non_2xx, "non-2xx"),
            (result.timeouts, "timeouts"),
            (result.socket_errors, "socket"),
        )
        if n
    ]
    return ", ".join(parts) or "0"


def _times(numerator: float | None, denominator: float | None) -> str:
    if numerator is None or denominator is None:
        return "—"
    if denominator <= 0:
        return "n/a (≤ 0)"
    return f"{numerator / denominator:.1f}x"


def latency_table(results: Results) -> Table:
    table = Table(
        title="Latency: one request at a time (1 conn), then fixed request rates "
        "(added = path - direct under the same load, same run)"
    )
    for column in ("rate", "path", "achieved req/s", "p50 ms", "p99 ms", "added p50 ms",
                   "added p99 ms", "errors"):  # fmt: skip
        table.add_column(column, justify="left" if column == "path" else "right")
    for rate, rounds in results.fixed.items():
        for number, runs in enumerate(rounds, 1):
            for name, result in runs.items():
                added = _added_in(runs, name) if name != "direct" else None
                achieved = f"{result.rate:.0f}"
                if rate and result.rate < 0.95 * rate:
                    achieved += " [red](saturated)"
                table.add_row(
                    f"{_rate(rate)} #{number}", name, achieved, _ms(result.p50_ms),
                    _ms(result.p99_ms), _ms(added[0] if added else None),
                    _ms(added[1] if added else None), _errors(result),
                )  # fmt: skip
        table.add_section()
    return table


def throughput_table(results: Results) -> Table:
    table = Table(title="Maximum throughput (closed loop, every connection busy)")
    for column in ("path", "req/s", "p50 ms", "p99 ms", "errors"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for name, result in results.peak.items():
        table.add_row(name, f"{result.rate:.0f}", _ms(result.p50_ms), _ms(result.p99_ms),
                      _errors(result))  # fmt: skip
    tuneloop = results.peak.get("tuneloop")
    drain = results.drain_s.get("max")
    if tuneloop is not None and drain is not None:
        sustained = tuneloop.ok / (tuneloop.duration_s + drain)
        table.add_row(
            "tuneloop incl. capture",
            f"{sustained:.0f}",
            "",
            "",
            f"answers ÷ (run + {drain:.1f} s until the last sample was persisted)",
        )
    return table


def ratio_table(results: Results) -> Table:
    table = Table(title="tuneloop vs LiteLLM proxy (2 workers), same upstream, same run")
    for column in ("measure", "tuneloop", "LiteLLM", "ratio (>1: tuneloop better)"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    for rate in results.fixed:
        ours, theirs = _added(results, rate, "tuneloop"), _added(results, rate, "litellm")
        for i, which in enumerate(("p50", "p99")):
            mine = ours[i] if ours else None
            other = theirs[i] if theirs else None
            table.add_row(
                f"added {which} ms, " + ("one at a time" if rate == 0 else f"{rate:g} req/s")
                + f" (median of {len(results.fixed[rate])})",
                _ms(mine), _ms(other),
                _times(other, mine) if other is not None else "—",
            )  # fmt: skip
    ours_peak = results.peak.get("tuneloop")
    theirs_peak = results.peak.get("litellm")
    table.add_row(
        "max req/s",
        f"{ours_peak.rate:.0f}" if ours_peak else "—",
        f"{theirs_peak.rate:.0f}" if theirs_peak else "—",
        _times(ours_peak.rate if ours_peak else None, theirs_peak.rate if theirs_peak else None),
    )
    return table


def goals_table(results: Results) -> Table:
    table = Table(title="Goals (issue 3) — marks, not assertions")
    for column in ("goal", "measured", ""):
        table.add_column(column)
    added = _added(results, GOAL_RATE, "tuneloop")
    for i, (which, goal) in enumerate((("p50", GOAL_P50_MS), ("p99", GOAL_P99_MS))):
        measured = added[i] if added else None
        table.add_row(
            f"added {which} ≤ {goal:g} ms at {GOAL_RATE:g} req/s, capture on (median of rounds)",
            "not measured" if measured is None else f"{measured:.2f} ms",
            "" if measured is None else (PASS if measured <= goal else FAIL),
        )
    ours, theirs = results.peak.get("tuneloop"), results.peak.get("litellm")
    if ours and theirs and theirs.rate > 0:
        factor = ours.rate / theirs.rate
        table.add_row(
            f"max throughput ≥ {GOAL_THROUGHPUT_X:g}x LiteLLM's",
            f"{factor:.1f}x ({ours.rate:.0f} vs {theirs.rate:.0f} req/s)",
            PASS if factor >= GOAL_THROUGHPUT_X else FAIL,
        )
    else:
        table.add_row(f"max throughput ≥ {GOAL_THROUGHPUT_X:g}x LiteLLM's", "no baseline", "")
    return table


def render(console: Console, results: Results, *, generator: str, cpus: int | None) -> None:
    console.print(f"\nmachine: {cpus} CPUs, shared with the load generator, NATS, S3 and the fake "
                  f"upstream (other processes may be running); load generator: {generator}")  # fmt: skip
    console.print(latency_table(results))
    console.print(throughput_table(results))
    if results.litellm_missing:
        console.print(f"[bold red]LiteLLM baseline missing: {results.litellm_missing}")
    console.print(ratio_table(results))
    console.print(goals_table(results))
    share = results.captured / results.answered if results.answered else 0.0
    console.print(
        f"capture on: {results.captured} gateway samples persisted for {results.answered} "
        f"2xx answers counted by wrk ({100 * share:.1f}%; counted in tuneloop's SQLite database)"
        + (
            "; above 100% because requests still in flight when wrk stopped were answered and "
            "captured but not counted"
            if results.captured > results.answered
            else ""
        )
    )
