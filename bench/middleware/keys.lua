-- wrk script of bench/scripts/middleware.sh: POST /pay with an
-- Idempotency-Key per request, and one JSON line of results at the end
-- (wrk's own summary has no p999).
--
--   wrk ... -s keys.lua URL -- fresh RUN_ID     a new key per request
--   wrk ... -s keys.lua URL -- replay RUN_ID    64 keys in turn (completed
--                                               by an earlier run of the
--                                               same RUN_ID)
local mode, base, run, counter = "fresh", "run", "run", 0
local body = '{"amount":100}'

function init(args)
    mode = args[1] or mode
    base = args[2] or base
    -- Several wrk threads would each count from 0: the thread's table
    -- address keeps their fresh keys apart.
    run = base .. "-" .. tostring({}):gsub("[^%w]", "")
end

function request()
    counter = counter + 1
    local key
    if mode == "replay" then
        key = "replay-" .. base .. "-" .. (counter % 64)
    else
        key = run .. "-" .. counter
    end
    return wrk.format("POST", "/pay", {
        ["Idempotency-Key"] = key,
        ["Content-Type"] = "application/json",
    }, body)
end

function done(summary, latency, requests)
    local seconds = summary.duration / 1e6
    local errors = summary.errors.connect + summary.errors.read + summary.errors.write
        + summary.errors.timeout
    io.write(string.format(
        'RESULT {"requests":%d,"per_s":%.1f,"p50_ms":%.3f,"p99_ms":%.3f,"p999_ms":%.3f,"max_ms":%.3f,"socket_errors":%d,"non_2xx":%d}\n',
        summary.requests, summary.requests / seconds,
        latency:percentile(50) / 1000, latency:percentile(99) / 1000,
        latency:percentile(99.9) / 1000, latency.max / 1000,
        errors, summary.errors.status))
end
