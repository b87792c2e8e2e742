-- wrk script for the gateway benchmark: POST one JSON body with an Authorization header and,
-- when BENCH_RATE is set, pace the requests to that constant rate (req/s per wrk thread).
--
-- Pacing claims slots on a fixed schedule t0 + k/rate (like wrk2, per thread): a request waits
-- for its slot, so the offered rate does not drop when the server is slow, as long as enough
-- connections are idle. wrk measures each latency from the request's first byte written.
-- Environment: BENCH_BODY_FILE, BENCH_AUTH (the header value), BENCH_RATE (optional),
-- BENCH_PATH (default /v1/chat/completions). Prints one JSON line prefixed "BENCH_JSON ".
local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clk_id, bench_timespec *tp);
]]
local clock = ffi.new("bench_timespec")
local function now_ms()
  ffi.C.clock_gettime(1, clock) -- CLOCK_MONOTONIC
  return tonumber(clock.tv_sec) * 1000 + tonumber(clock.tv_nsec) / 1e6
end

local body_file = assert(io.open(assert(os.getenv("BENCH_BODY_FILE")), "rb"))
wrk.method = "POST"
wrk.path = os.getenv("BENCH_PATH") or "/v1/chat/completions"
wrk.body = body_file:read("*a")
body_file:close()
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = os.getenv("BENCH_AUTH")

local rate = tonumber(os.getenv("BENCH_RATE") or "")
if rate then
  local interval = 1000 / rate
  local next_slot = nil
  function delay()
    local now = now_ms()
    if next_slot == nil then
      next_slot = now
    end
    local wait = next_slot - now
    next_slot = next_slot + interval
    if wait < 0 then
      return 0
    end
    return wait
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"p50": %d, "p90": %d, "p99": %d, "p999": %d, "max": %d, "mean": %.1f}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max, latency.mean))
end
