#!/usr/bin/env python3
"""One h2load run as the JSON line report.lua prints for wrk, so report.py takes both alike.

usage: h2load_json.py H2LOAD_OUTPUT LOG_FILE [LOG_RUN_OUTPUT]

req/s from h2load's summary ("finished in ..., N req/s"); p50/p90/p99/max from a per-request
--log-file (third column: microseconds from request to response end), which may come from a
second run (its summary LOG_RUN_OUTPUT: its errors count too). Errors: failed + errored
streams as read errors, timeouts, and non-2xx status codes.
"""
import json
import re
import sys


def summary(path):
    out = open(path).read()
    m = re.search(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s", out)
    r = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                  r"(\d+) errored, (\d+) timeout", out)
    s = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    if not m or not r or not s:
        sys.exit("h2load_json: no h2load summary in %s" % path)
    return m, r, s


def errors(r, s):
    return {"err_read": int(r.group(4)) + int(r.group(5)), "err_timeout": int(r.group(6)),
            "err_status": int(s.group(2)) + int(s.group(3)) + int(s.group(4))}


def main():
    m, r, s = summary(sys.argv[1])
    err = errors(r, s)
    if len(sys.argv) > 3:
        for k, v in errors(*summary(sys.argv[3])[1:]).items():
            err[k] += v
    secs = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
    lat = []
    for line in open(sys.argv[2]):
        f = line.split("\t")
        if len(f) >= 3:
            lat.append(int(f[2]))
    lat.sort()

    def pct(p):
        return lat[min(len(lat) - 1, int(len(lat) * p / 100))] if lat else 0

    print("BENCHJSON " + json.dumps({
        "requests": int(r.group(3)), "duration_us": int(secs * 1e6), "rps": float(m.group(3)),
        "p50_us": pct(50), "p90_us": pct(90), "p99_us": pct(99), "max_us": lat[-1] if lat else 0,
        "err_connect": 0, "err_read": err["err_read"], "err_write": 0,
        "err_timeout": err["err_timeout"], "err_status": err["err_status"],
    }))


if __name__ == "__main__":
    main()
