"""What load/run and load/fleet share: starting agentid, wrk and oha, and reading the server's
own latency histogram (the method: load/README.md)."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WRK = os.path.join(ROOT, "load", "wrk")
VERIFY_ROUTE = "/v1/verify/{token}"
# oha gets enough connections for every request in flight to take this long: an open loop
# holds rate × latency requests, and with fewer connections oha queues them itself, so its
# corrected percentiles would measure its own backlog.
OHA_REQUEST_MS = 5.0


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def http(method, url, key=None, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def approve(binary, db_url, workdir, org, domain):
    """Grants organization `org` (its name) the issuer domain `domain`, as an operator does:
    a server only registers agents under names their organization holds. Needs the fleet's
    key file, which the first server started in `workdir` made."""
    sh([binary, "domain", "approve", "--org", org, domain, "--database-url", db_url,
        "--signing-key-file", os.path.join(workdir, "signing-key.pem")])


class Server:
    def __init__(self, binary, db_url, workdir, port, metrics_port, env_extra):
        env = dict(os.environ, DATABASE_URL=db_url, AGENTID_BIND=f"127.0.0.1:{port}",
                   AGENTID_METRICS_BIND=f"127.0.0.1:{metrics_port}", RUST_LOG="warn",
                   AGENTID_SIGNING_KEY_FILE=os.path.join(workdir, "signing-key.pem"),
                   # Measurements stop the server at once (no balancer waits for its drain).
                   AGENTID_SHUTDOWN_DRAIN_SECONDS="0", **env_extra)
        self.log = open(os.path.join(workdir, f"server-{port}.log"), "a")
        self.proc = subprocess.Popen([binary, "serve"], env=env, cwd=workdir,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        for line in self.proc.stdout:
            if line.startswith("agentid: listening on "):
                break
        else:
            raise SystemExit("agentid did not start; see " + self.log.name)
        self.base = f"http://127.0.0.1:{port}"
        self.metrics = f"http://127.0.0.1:{metrics_port}/metrics"

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        self.log.close()


def wrk(script, url, args, duration, threads, conns):
    out = sh(["wrk", "-t", str(threads), "-c", str(conns), "-d", f"{duration}s", "--latency",
              "-s", os.path.join(WRK, script), url, "--", *args]).stdout
    res = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    res["rps"] = res["requests"] / (res["duration_us"] / 1e6)
    return res


def wrk_max(script, url, args, duration, threads, conn_levels):
    """The maximum rate: wrk at each connection count, the best run counts. A durable verify
    commits in groups, so its rate climbs with concurrency until the CPU is full, while the
    floor's barely moves. `verify_ok_all_runs` counts the verifications answered over every
    run (each left its audit record)."""
    runs = [wrk(script, url, args, duration, threads, c) for c in conn_levels]
    best = max(runs, key=lambda r: r["rps"])
    return dict(best, connections=conn_levels[runs.index(best)],
                verify_ok_all_runs=sum(r["verify_ok"] for r in runs),
                rps_by_connections={str(c): r["rps"] for c, r in zip(conn_levels, runs)})


def at_levels(w):
    """`61,412 req/s (128: 60,100; 512: 61,412)`-style text for a wrk_max result."""
    levels = "; ".join(f"{c}: {r:,.0f}" for c, r in w["rps_by_connections"].items())
    return f"{w['rps']:9.0f} req/s ({levels})"


def oha(target, rate, duration, conns, extra=()):
    """oha at a fixed rate, with latency correction; its JSON summary."""
    conns = max(conns, int(rate * OHA_REQUEST_MS / 1000) + 1)
    args = ["oha", "--no-tui", "--output-format", "json", "-z", f"{duration}s", "-c", str(conns),
            "-q", str(max(1, int(rate))), "--latency-correction", "-w", *extra, target]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"oha failed ({out.returncode}): {out.stderr}")
    o = json.loads(out.stdout)
    ok = sum(v for k, v in o.get("statusCodeDistribution", {}).items() if k.startswith("2"))
    p = o["latencyPercentiles"]
    return {"rps": o["summary"]["requestsPerSec"], "p50_ms": p["p50"] * 1000, "p99_ms": p["p99"] * 1000,
            "answered_2xx": ok, "status": o.get("statusCodeDistribution", {})}


def scrape(server):
    """The server's metrics page, as text."""
    return urllib.request.urlopen(server.metrics, timeout=10).read().decode()


def metric_sum(server, name, label=None):
    """The sum of the series whose line starts with `name` (and has `label`)."""
    total = 0.0
    for line in scrape(server).splitlines():
        if line.startswith(name) and (label is None or label in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def histogram(server, route):
    """Cumulative buckets {le seconds: count} of the request-duration histogram of a route."""
    buckets = {}
    for line in scrape(server).splitlines():
        if line.startswith("agentid_http_request_duration_seconds_bucket") and f'route="{route}"' in line:
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[float(le)] = float(line.rsplit(" ", 1)[1])
    return buckets


def server_side(before, after):
    """The server's own view of the requests between two histogram readings: p99 estimated as
    Prometheus' histogram_quantile does (linear within a bucket), and the share answered
    within 5 ms (a bucket bound, so exact)."""
    les = sorted(after)
    counts = [after[le] - before.get(le, 0.0) for le in les]
    total = counts[-1] if counts else 0
    if not total:
        return {"server_p99_ms": None, "server_within_5ms": None}
    rank, p99, prev_le, prev_c = 0.99 * total, None, 0.0, 0.0
    for le, c in zip(les, counts):
        if c >= rank:
            p99 = prev_le if le == float("inf") else prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
            break
        prev_le, prev_c = le, c
    return {"server_p99_ms": p99 * 1000, "server_within_5ms": dict(zip(les, counts))[0.005] / total}


def box_ticks():
    """The machine's CPU times (/proc/stat: user nice system idle iowait irq softirq steal)."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def box_busy(before, after):
    d = [y - x for x, y in zip(before, after)]
    return 1 - (d[3] + d[4]) / (sum(d) or 1)


def settled(server):
    """Waits until the server has answered everything in flight: when wrk stops, requests of
    its connections may still be in the server, and they must not count toward the next
    phase's histogram."""
    last = None
    for _ in range(40):
        now = metric_sum(server, "agentid_http_request_duration_seconds_count")
        if now == last:
            return
        last = now
        time.sleep(0.25)
    print("  warning: the server was still answering 10 s after wrk stopped", file=sys.stderr, flush=True)


def measured(server, routes, run):
    """Runs `run()` (oha at a fixed rate), with the server's histograms of `routes` and the
    machine's CPU read before and after it."""
    settled(server)
    before, ticks = {r: histogram(server, r) for r in routes}, box_ticks()
    out = run()
    busy = box_busy(ticks, box_ticks())
    return out, {r: server_side(before[r], histogram(server, r)) for r in routes}, busy


def oha_phase(server, route, target, rate, a, extra):
    o, server_view, busy = measured(server, [route], lambda: oha(target, rate, a.duration, a.oha_connections, extra))
    return dict(o, **server_view[route], box_busy=busy)


def describe(o):
    return (f"p50 {o['p50_ms']:.2f} ms  p99 {o['p99_ms']:.2f} ms  at {o['rps']:.0f} req/s"
            f"  (server p99 {o['server_p99_ms']:.2f} ms, {100 * o['server_within_5ms']:.2f} % within 5 ms;"
            f" box {100 * o['box_busy']:.0f} % busy)")


def write_lines(workdir, name, lines):
    path = os.path.join(workdir, name)
    with open(path, "w") as f:
        f.write("".join(f"{line}\n" for line in lines))
    return path


COUNT_SQL = "SELECT COALESCE(SUM(last_seq - first_seq + 1), 0) FROM audit_blocks"


def count_records(db_url):
    """Records in the durable log."""
    if db_url.startswith("postgres"):
        return int(sh(["psql", db_url, "-Atqc", COUNT_SQL]).stdout.strip())
    with sqlite3.connect(db_url.split("://", 1)[1]) as db:
        return db.execute(COUNT_SQL).fetchone()[0]


