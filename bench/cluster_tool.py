#!/usr/bin/env python3
"""Helpers of bench/cluster.sh: cluster status, CPU/RSS samples, one JSON
record per run, the failover analysis. No third-party modules; talks to the
servers only through etcdctl, on the loopback endpoints it is given.

  cluster_tool.py status EP,EP,EP          one JSON line: each endpoint's member ID, leader, term, index
  cluster_tool.py leader EP,EP,EP          "<index> <member id>" of the leader all three agree on; exit 1 otherwise
  cluster_tool.py whole EP,EP,EP           exit 0 when every endpoint answers, they agree on a leader, and all
                                           list the same members, three started voters; else why not on stderr
  cluster_tool.py sample pre|post EPS PID... CPU ticks, VmHWM of each PID, machine busy ticks, load, status
  cluster_tool.py record PRE POST OUT TIMEF k=v...   one JSON line for a benchmark run
  cluster_tool.py failover LOAD_JSON KILLS_TSV k=v... one JSON line for a failover run
The Markdown summary is cluster_summary.py's.
"""
import json
import os
import re
import statistics
import subprocess
import sys
import time

ETCDCTL = os.environ.get("ETCDCTL", "etcdctl")
HZ = os.sysconf("SC_CLK_TCK")


def etcdctl(ep, *args, timeout=4):
    env = dict(os.environ)
    try:
        p = subprocess.run([ETCDCTL, "--endpoints", ep, "--dial-timeout", "1s",
                            "--command-timeout", "2s", *args],
                           capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, "etcdctl timed out"
    if p.returncode != 0:
        return None, (p.stderr or p.stdout).strip()[-300:]
    return p.stdout, None


def status(eps):
    """Status of each endpoint: dict or {'error': ...}."""
    out = []
    for ep in eps:
        text, err = etcdctl(ep, "endpoint", "status", "-w", "json")
        if text is None:
            out.append({"endpoint": ep, "error": err})
            continue
        try:
            s = json.loads(text)[0]["Status"]
            out.append({"endpoint": ep, "id": s["header"]["member_id"], "leader": s["leader"],
                        "term": s["raftTerm"], "index": s["raftIndex"],
                        "applied": s.get("raftAppliedIndex"), "revision": s["header"]["revision"]})
        except Exception as e:  # an answer we cannot read counts as no answer
            out.append({"endpoint": ep, "error": f"unreadable status: {e}"})
    return out


def agreed_leader(st):
    """(index, id) of the leader when every endpoint answered and names the
    same leader, which is one of them; else None."""
    if any("error" in s for s in st):
        return None
    leaders = {s["leader"] for s in st}
    if len(leaders) != 1:
        return None
    lid = leaders.pop()
    for i, s in enumerate(st):
        if s["id"] == lid:
            return i, lid
    return None


def members(ep):
    text, err = etcdctl(ep, "member", "list", "-w", "json")
    if text is None:
        return None
    try:
        return json.loads(text).get("members", [])
    except Exception:
        return None


def whole(eps):
    """None when every endpoint answers, they agree on a leader, and every
    one lists the same members: as many started voters as endpoints.
    Otherwise why not."""
    st = status(eps)
    if not agreed_leader(st):
        return "no agreed leader: " + json.dumps(st)
    lists = {}
    for ep in eps:
        ms = members(ep)
        if ms is None:
            return f"{ep}: no member list"
        lists[ep] = sorted((m.get("ID"), m.get("name", ""), bool(m.get("isLearner"))) for m in ms)
    views = {json.dumps(v) for v in lists.values()}
    if len(views) != 1:
        return "the members disagree on the member list: " + json.dumps(lists)
    view = next(iter(lists.values()))
    started = [m for m in view if m[1] and not m[2]]
    if len(view) != len(eps) or len(started) != len(eps):
        return "not every member is a started voter: " + json.dumps(view)
    return None


def proc_ticks(pid):
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    f = stat[stat.rfind(")") + 2:].split()
    return int(f[11]) + int(f[12])


def proc_hwm_mb(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024)
    except OSError:
        pass
    return None


def machine_busy():
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(f[i] for i in (0, 1, 2, 5, 6, 7))


def sample(when, eps, pids):
    """CPU ticks and peak RSS of `pids`, machine busy time, load, and the
    members' status: asked before the CPU is read for a "pre" sample and
    after it for a "post" one, so the status calls stay out of the window."""
    st = status(eps) if eps and when == "pre" else []
    d = {"t": time.time(), "busy": machine_busy(), "load1": float(open("/proc/loadavg").read().split()[0]),
         "ticks": [proc_ticks(p) for p in pids], "hwm_mb": [proc_hwm_mb(p) for p in pids], "pids": pids}
    d["status"] = status(eps) if eps and when != "pre" else st
    return d


def parse_benchmark(text):
    """The fields of etcd's benchmark report (pkg/report; seconds)."""
    def grab(pattern):
        m = re.search(pattern, text, re.M)
        return float(m.group(1)) if m else None
    errs = 0
    m = re.search(r"Error distribution:\n((?:.*\n?)*)", text)
    if m:
        for line in m.group(1).splitlines():
            e = re.match(r"\s*\[(\d+)\]", line)
            if e:
                errs += int(e.group(1))
    ms = lambda v: None if v is None else round(v * 1000, 3)
    return {"ops_per_s": grab(r"Requests/sec:\s*([\d.]+)"), "total_s": grab(r"^\s*Total:\s*([\d.]+)"),
            "lat_mean_ms": ms(grab(r"^\s*Average:\s*([\d.]+)")),
            "lat_p50_ms": ms(grab(r"^\s*50% in ([\d.]+)")), "lat_p90_ms": ms(grab(r"^\s*90% in ([\d.]+)")),
            "lat_p99_ms": ms(grab(r"^\s*99% in ([\d.]+)")), "lat_p999_ms": ms(grab(r"^\s*99\.9% in ([\d.]+)")),
            "errors": errs}


def kv_args(args):
    d = {}
    for a in args:
        k, _, v = a.partition("=")
        try:
            d[k] = json.loads(v)
        except ValueError:
            d[k] = v
    return d


def record(pre_path, post_path, out_path, time_path, extra):
    pre, post = json.load(open(pre_path)), json.load(open(post_path))
    text = open(out_path, errors="replace").read()
    d = dict(extra)
    d.update(parse_benchmark(text))
    wall = post["t"] - pre["t"]
    try:
        cu, cs = open(time_path).read().split()[-2:]
        client = float(cu) + float(cs)
    except Exception:
        client = None
    cpu = [None if a is None or b is None else round((b - a) / HZ, 2) for a, b in zip(pre["ticks"], post["ticks"])]
    # Roles at the start: the leader, then the followers.
    lead = agreed_leader(pre["status"])
    roles = ["leader" if lead and i == lead[0] else "follower" for i in range(len(cpu))]
    if len(cpu) == 1:
        roles = ["single"]
    total = sum(c for c in cpu if c is not None)
    if isinstance(d.get("total"), int):
        ops = d["total"] - d["errors"]
    else:
        ops = round((d.get("ops_per_s") or 0) * (d.get("total_s") or 0))
    d.update({"wall_s": round(wall, 2), "member_cpu_s": cpu, "member_roles": roles,
              "member_peak_rss_mb": post["hwm_mb"], "server_cpu_s": round(total, 2),
              "server_cpu_us_per_op": round(total * 1e6 / ops, 1) if ops else None,
              "client_cpu_s": client, "load1_before": pre["load1"], "ops": ops})
    if client is not None and wall > 0:
        other = (post["busy"] - pre["busy"]) / HZ - total - client
        d["other_cpu_frac"] = round(max(other, 0) / (os.cpu_count() * wall), 3)
    terms0 = [s.get("term") for s in pre["status"]]
    terms1 = [s.get("term") for s in post["status"]]
    lead1 = agreed_leader(post["status"])
    d["term_before"], d["term_after"] = terms0, terms1
    d["leader_before"] = lead[1] if lead else None
    d["leader_after"] = lead1[1] if lead1 else None
    if pre["status"] and all(t is not None for t in terms0 + terms1):
        # Each election raises the term: the count of elections during the run.
        changes = max(terms1) - max(terms0)
        if d["leader_before"] != d["leader_after"]:
            changes = max(changes, 1)
        d["leader_changes"] = changes
    else:
        d["leader_changes"] = None
    if d.get("ops_per_s") is None:
        d["failed"] = True
        d["error"] = text[-300:]
    print(json.dumps(d))


def failover(load_path, kills_path, extra):
    """Per kill: the longest gap between acknowledged writes that overlaps
    [kill, kill + window] (window: until the restart began), and the longest
    one during the restart and settling that followed."""
    d = dict(extra)
    try:
        load = json.loads(open(load_path).read().strip().splitlines()[-1])
    except Exception as e:
        d.update({"failed": True, "error": f"no load report: {e}"})
        print(json.dumps(d))
        return
    gaps = load.get("gaps_unix_ms", [])
    gap_min = load.get("gap_min_ms", 50)
    kills = []
    for line in open(kills_path):
        f = line.split()
        if len(f) >= 5:
            elected = float(f[3])
            kills.append({"kill_ms": float(f[0]), "restart_ms": float(f[1]), "whole_ms": float(f[2]),
                          "election_ms": round(elected - float(f[0])) if elected else None,
                          "member": f[4], "note": " ".join(f[5:])})

    def longest(a, b, midpoint=False):
        """The longest gap overlapping [a, b] (with midpoint: whose middle
        lies in [a, b), so that a gap is not counted in two phases)."""
        best = 0.0
        for g0, g1 in gaps:
            inside = a <= (g0 + g1) / 2 < b if midpoint else (g1 >= a and g0 <= b)
            if inside:
                best = max(best, g1 - g0)
        return round(best, 1)

    def resumed_after(t):
        """How long after t the first write was acknowledged: the end of
        the gap that spans t, or 0 when writes went on through it."""
        return round(max((g1 - t for g0, g1 in gaps if g0 <= t < g1), default=0.0), 1)

    for i, k in enumerate(kills):
        nxt = kills[i + 1]["kill_ms"] if i + 1 < len(kills) else load.get("end_unix_ms", k["whole_ms"])
        k["gap_ms"] = longest(k["kill_ms"], k["restart_ms"])
        k["resumed_after_restart_ms"] = resumed_after(k["restart_ms"])
        # From the restart to the next kill: restart, catch-up, settling.
        k["recovery_gap_ms"] = longest(k["restart_ms"], nxt, midpoint=True)
        k["recovery_s"] = round((k["whole_ms"] - k["restart_ms"]) / 1000, 2)
    gm = [k["gap_ms"] for k in kills]
    el = [k["election_ms"] for k in kills if k["election_ms"] is not None]
    d.update({
        "kills": kills, "kill_count": len(kills),
        "max_gap_ms": max(gm) if gm else None,
        "median_gap_ms": statistics.median(gm) if gm else None,
        "max_recovery_gap_ms": max((k["recovery_gap_ms"] for k in kills), default=None),
        "median_election_ms": statistics.median(el) if el else None,
        "median_resumed_after_restart_ms": statistics.median(
            [k["resumed_after_restart_ms"] for k in kills]) if kills else None,
        "gap_floor_ms": gap_min,
        "writes_acked": load.get("ops"), "write_errors": load.get("errors"),
        "error_kinds": load.get("error_kinds"), "error_samples": load.get("error_samples"),
        "member_switches": load.get("member_switches"), "load_elapsed_s": load.get("elapsed_s"),
        "load_rate": load.get("rate"), "load_clients": load.get("clients"),
        "load_max_gap_ms": load.get("max_gap_ms"), "lat_p99_ms": load.get("lat_p99_ms"),
    })
    if len(kills) == 0:
        d["failed"] = True
    print(json.dumps(d))


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "status":
        print(json.dumps(status(args[0].split(","))))
    elif cmd == "leader":
        lead = agreed_leader(status(args[0].split(",")))
        if not lead:
            sys.exit(1)
        print(lead[0], lead[1])
    elif cmd == "whole":
        why = whole(args[0].split(","))
        if why:
            print(why, file=sys.stderr)
            sys.exit(1)
    elif cmd == "sample":
        eps = args[1].split(",") if args[1] else []
        print(json.dumps(sample(args[0], eps, [int(p) for p in args[2:]])))
    elif cmd == "record":
        record(*args[:4], kv_args(args[4:]))
    elif cmd == "failover":
        failover(args[0], args[1], kv_args(args[2:]))
    elif cmd == "hex":
        print(format(int(args[0]), "x"))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
