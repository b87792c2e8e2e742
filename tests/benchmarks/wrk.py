"""The load generator of the gateway benchmark: `wrk` (Debian's package) with wrk_post.lua.

wrk is C on one event-loop thread, so it takes little of the 2 cores it shares with what it
measures. Fixed-rate runs pace requests on a constant schedule in Lua (wrk2-like; see the
script); throughput runs are closed-loop (every connection sends again as soon as it is answered).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import orjson

LUA = Path(__file__).with_name("wrk_post.lua")


class WrkMissing(RuntimeError):
    pass


def wrk_binary() -> str:
    found = shutil.which("wrk")
    if found is None:
        raise WrkMissing(
            "wrk is not installed: `make bench-gateway` installs it (apt-get install wrk), "
            "or install it by hand"
        )
    return found


def wrk_version() -> str:
    out = subprocess.run([wrk_binary(), "-v"], capture_output=True, text=True, check=False)
    found = re.search(r"wrk\s+(\S+)", out.stdout + out.stderr)
    return found.group(1) if found else "unknown"


@dataclass
class WrkResult:
    requests: int
    duration_s: float
    non_2xx: int
    socket_errors: int
    timeouts: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float

    @property
    def rate(self) -> float:
        return self.requests / self.duration_s if self.duration_s else 0.0

    @property
    def ok(self) -> int:
        """Responses that came back 2xx/3xx (wrk counts the others as status errors)."""
        return self.requests - self.non_2xx


def run_wrk(
    url: str,
    *,
    body_file: Path,
    auth: str,
    duration_s: float,
    connections: int,
    rate: float | None = None,
    timeout_s: float = 10.0,
) -> WrkResult:
    env = {**os.environ, "BENCH_BODY_FILE": str(body_file), "BENCH_AUTH": auth}
    env.pop("BENCH_RATE", None)
    if rate is not None:
        env["BENCH_RATE"] = str(rate)
    argv = [
        wrk_binary(),
        "-t1",
        f"-c{connections}",
        f"-d{duration_s:g}s",
        f"--timeout={timeout_s:g}s",
        "-s",
        str(LUA),
        url,
    ]
    done = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=duration_s + timeout_s + 30
    )
    line = next(
        (ln for ln in done.stdout.splitlines() if ln.startswith("BENCH_JSON ")),
        None,
    )
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr}")
    data = orjson.loads(line.removeprefix("BENCH_JSON "))
    errors, latency = data["errors"], data["latency_us"]
    return WrkResult(
        requests=data["requests"],
        duration_s=data["duration_us"] / 1e6,
        non_2xx=errors["status"],
        socket_errors=errors["connect"] + errors["read"] + errors["write"],
        timeouts=errors["timeout"],
        p50_ms=latency["p50"] / 1000,
        p90_ms=latency["p90"] / 1000,
        p99_ms=latency["p99"] / 1000,
        p999_ms=latency["p999"] / 1000,
        max_ms=latency["max"] / 1000,
    )
