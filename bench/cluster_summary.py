#!/usr/bin/env python3
"""The Markdown summary of a bench/cluster.sh run: medians per case and
system, ephd/etcd ratios, per-member CPU and RSS, leader changes, p99 at
half of peak against a single member, failover gaps, the issue's targets,
and every run. Usage: cluster_summary.py runs.jsonl > summary.md"""
import json
import statistics
import sys

lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
meta = next((d for d in lines if d.get("meta")), {})
runs = [d for d in lines if not d.get("meta")]
ok = [d for d in runs if not d.get("failed")]
N = meta.get("members", 3)
NAMES = {"etcd": f"etcd ×{N}", "ephd": f"ephd ×{N}", "ephd1": "ephd ×1", "etcd1": "etcd ×1"}


def sel(case, system):
    return [d for d in ok if d.get("case") == case and d.get("system") == system]


def med(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    return statistics.median(xs) if xs else None


def fmt(x, nd=0):
    if x is None:
        return "–"
    if nd == 0:
        return f"{x:,.0f}"
    return f"{x:,.{nd}f}"


def ratio(a, b, nd=2):
    return f"{a / b:.{nd}f}×" if a is not None and b else "–"


def by_role(rs, key):
    """Median per role: the leader, then the followers (sorted high to low)."""
    rows = []
    for d in rs:
        vals = d.get(key) or []
        roles = d.get("member_roles") or []
        lead = [v for v, r in zip(vals, roles) if r in ("leader", "single")]
        fol = sorted((v for v, r in zip(vals, roles) if r == "follower" and v is not None), reverse=True)
        rows.append(lead[:1] + fol)
    width = max((len(r) for r in rows), default=0)
    return [med([r[i] for r in rows if len(r) > i]) for i in range(width)]


out = []
w = out.append
w(f"# {N}-member ephd against {N}-member stock etcd (`bench/cluster.sh`)\n")
if meta.get("killed", 1) > 1:
    w(f"Failover kills {meta['killed']} members at once, the leader and the next.\n")
w(f"Started {meta.get('started', '?')}, ephd `{meta.get('git', '?')}`, {meta.get('etcd_version', '?')}, "
  f"{meta.get('cpu', '?')} × {meta.get('nproc', '?')}; 1/5/15-minute load before: "
  f"{' / '.join(meta.get('load_before', []))} (waited {meta.get('load_waited_s', 0)} s for it to drop). "
  f"etcd's `benchmark` ({meta.get('benchmark') or 'version not recorded'}), `--clients 100 --conns 10 --total {meta.get('total', '?'):,} --key-size 48 "
  f"--val-size 1024 --key-space-size 100000`, a fresh cluster per run, etcd data dirs on tmpfs.\n")
if meta.get("ephd_env") or meta.get("etcd_env"):
    w(f"Environment of the three-member clusters' processes (not the single member's): ephd "
      f"`{meta.get('ephd_env') or '(none)'}`, etcd `{meta.get('etcd_env') or '(none)'}`.\n")

for case in ("put", "txn-put", "range"):
    e, p = sel(case, "etcd"), sel(case, "ephd")
    if not e and not p:
        continue
    w(f"## `{case}`, medians ({len(e)} etcd runs, {len(p)} ephd runs)\n")
    w("| | ops/s | p50 ms | p99 ms | server CPU µs/op (3 members) | CPU s leader / followers | "
      "peak RSS MB leader / followers | leader changes (all runs) | client CPU s | other CPU | load1 before |")
    w("|---|---:|---:|---:|---:|---|---|---:|---:|---:|---:|")
    meds = {}
    for s, rs in (("etcd", e), ("ephd", p)):
        m = {k: med([d.get(k) for d in rs]) for k in
             ("ops_per_s", "lat_p50_ms", "lat_p99_ms", "server_cpu_us_per_op", "client_cpu_s",
              "other_cpu_frac", "load1_before")}
        meds[s] = m
        lc = [d.get("leader_changes") for d in rs]
        lcs = "?" if any(x is None for x in lc) else str(sum(lc))
        cpu = " / ".join(fmt(x, 2) for x in by_role(rs, "member_cpu_s"))
        rss = " / ".join(fmt(x) for x in by_role(rs, "member_peak_rss_mb"))
        w(f"| {NAMES[s]} | {fmt(m['ops_per_s'])} | {fmt(m['lat_p50_ms'], 2)} | {fmt(m['lat_p99_ms'], 2)} | "
          f"{fmt(m['server_cpu_us_per_op'])} | {cpu} | {rss} | {lcs} | {fmt(m['client_cpu_s'], 2)} | "
          f"{fmt(m['other_cpu_frac'], 3)} | {fmt(m['load1_before'], 2)} |")
    w(f"\nephd/etcd throughput **{ratio(meds['ephd']['ops_per_s'], meds['etcd']['ops_per_s'])}**, "
      f"etcd/ephd server CPU per op **{ratio(meds['etcd']['server_cpu_us_per_op'], meds['ephd']['server_cpu_us_per_op'])}**, "
      f"etcd/ephd p99 {ratio(meds['etcd']['lat_p99_ms'], meds['ephd']['lat_p99_ms'])}.\n")

rate_cases = sorted({d["case"] for d in ok if d.get("case", "").startswith("put@")})
for case in rate_cases:
    # etcd-rate runs (a single etcd beside three) are at half etcd's peak.
    whose = "etcd" if sel(case, "etcd1") else "ephd"
    w(f"## `put` at {case.split('@')[1]}/s (half of the three-member {whose}'s median peak), medians\n")
    w("| | runs | ops/s | p50 ms | p99 ms | p99.9 ms | server CPU µs/op | leader changes | other CPU |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    p99 = {}
    for s in ("ephd", "ephd1", "etcd", "etcd1"):
        rs = sel(case, s)
        if not rs:
            continue
        p99[s] = med([d.get("lat_p99_ms") for d in rs])
        lc = [d.get("leader_changes") for d in rs if d.get("members") == 3]
        w(f"| {NAMES[s]} | {len(rs)} | {fmt(med([d.get('ops_per_s') for d in rs]))} | "
          f"{fmt(med([d.get('lat_p50_ms') for d in rs]), 2)} | {fmt(p99[s], 2)} | "
          f"{fmt(med([d.get('lat_p999_ms') for d in rs]), 2)} | {fmt(med([d.get('server_cpu_us_per_op') for d in rs]))} | "
          f"{sum(x for x in lc if x is not None) if lc else '–'} | {fmt(med([d.get('other_cpu_frac') for d in rs]), 3)} |")
    for s in ("ephd", "etcd"):
        if p99.get(s1 := s + "1"):
            w(f"\nthree-member / single-member {s} p99: **{ratio(p99.get(s), p99.get(s1))}**.\n")

fo = {s: sel("failover", s) for s in ("etcd", "ephd")}
notes = []


def incomplete(d):
    """A failover run that did not get through its kills."""
    return d.get("kill_count", 0) < meta.get("kills", 0) or any(k.get("note") != "ok" for k in d.get("kills", []))


if any(fo.values()):
    w("## Failover: leader SIGKILLed under load\n")
    w(f"`ephd-bench failover`: {meta.get('fo_clients', '?')} clients, {meta.get('fo_rate', 0):,.0f} puts/s "
      "(1 KiB values), 1 s request timeout, a client moves to the next member after a failure or timeout. "
      "Gap: the longest stretch without an acknowledged write, from the kill until the killed member was "
      + ("restarted on its data dir (etcd's and ephd's alike). " if meta.get("ephd_data") else
         "restarted (etcd, on its data dir) or replaced (ephd: member remove, member add, a new process "
         "with `--initial-cluster-state existing`). ")
      + "Gaps under the listing floor count as that floor.\n")
    args = {s: sorted({(d.get("server_args") or "").strip() for d in rs}) for s, rs in fo.items() if rs}
    for s, a in args.items():
        if any(a):
            w(f"{NAMES[s]} ran with extra flags: {', '.join(f'`{x}`' if x else 'none' for x in a)}.\n")
    w("| | runs | kills | longest gap ms | median gap ms (all kills) | per run: longest / median | "
      "new leader after ms (median) | longest gap while restarting ms | longest gap of the whole run ms | "
      "writes back after the restart began ms (median / longest) | restart until whole s (median) | "
      "write errors (all runs) |")
    w("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    fmed = {}
    for s, rs in fo.items():
        if not rs:
            continue
        kills = [k for d in rs for k in d.get("kills", [])]
        gaps = [max(k["gap_ms"], d.get("gap_floor_ms", 0)) for d in rs for k in d.get("kills", [])]
        fmed[s] = (max(gaps) if gaps else None, med(gaps))
        short = [d for d in rs if incomplete(d)]
        if short:
            notes.append(f"{NAMES[s]}: {len(short)} of {len(rs)} runs did not complete their {meta.get('kills', '?')} "
                         f"kills with the cluster whole again (kills done: "
                         f"{', '.join(str(d.get('kill_count')) for d in short)}; after the last one the cluster was "
                         "not whole within 60 s of bringing the killed member back: see the run list)")
        per = ", ".join(f"{fmt(d.get('max_gap_ms'))} / {fmt(d.get('median_gap_ms'))}" for d in rs)
        w(f"| {NAMES[s]} | {len(rs)} | {len(kills)} | {fmt(fmed[s][0])} | {fmt(fmed[s][1])} | {per} | "
          f"{fmt(med([k.get('election_ms') for k in kills]))} | {fmt(max((k['recovery_gap_ms'] for k in kills), default=None))} | "
          f"{fmt(max((d.get('load_max_gap_ms') or 0 for d in rs), default=None))} | "
          f"{fmt(med([k.get('resumed_after_restart_ms') for k in kills]))} / "
          f"{fmt(max((k.get('resumed_after_restart_ms') or 0 for k in kills), default=None))} | "
          f"{fmt(med([k['recovery_s'] for k in kills]), 1)} | {sum(d.get('write_errors') or 0 for d in rs):,} |")
    w("")
    for n in notes:
        w(f"**Incomplete**: {n}.\n")

# ---- targets
w("## Targets\n")
w("| target | figure | met |")
w("|---|---|---|")


def verdict(cond):
    return "–" if cond is None else ("**yes**" if cond else "**no**")


for case in ("put", "txn-put"):
    e = med([d.get("ops_per_s") for d in sel(case, "etcd")])
    p = med([d.get("ops_per_s") for d in sel(case, "ephd")])
    ce = med([d.get("server_cpu_us_per_op") for d in sel(case, "etcd")])
    cp = med([d.get("server_cpu_us_per_op") for d in sel(case, "ephd")])
    if e and p:
        w(f"| `{case}`: at least 2× etcd's ops/s | {ratio(p, e)} ({fmt(p)} vs {fmt(e)}) | {verdict(p >= 2 * e)} |")
    if ce and cp:
        w(f"| `{case}`: 3× less server CPU per op (sum of members) | {ratio(ce, cp)} less ({fmt(cp)} vs {fmt(ce)} µs) | "
          f"{verdict(ce >= 3 * cp)} |")
lc = [d.get("leader_changes") for d in ok if d.get("system") == "ephd" and d.get("case") != "failover"]
if lc:
    known = [x for x in lc if x is not None]
    w(f"| zero leader changes during the ephd runs | {sum(known)} in {len(known)} runs"
      f"{'' if len(known) == len(lc) else f' ({len(lc) - len(known)} unknown)'} | "
      f"{verdict(sum(known) == 0 and len(known) == len(lc))} |")


def p99_pair(case, s):
    """Median p99 of the three-member `s` and of its single member."""
    return tuple(med([d.get("lat_p99_ms") for d in sel(case, x)]) for x in (s, s + "1"))


for case in rate_cases:
    a, b = p99_pair(case, "ephd")
    if a and b:
        w(f"| put p99 at half of peak ({case.split('@')[1]}/s) ≤ 2× the single member's | {fmt(a, 2)} vs "
          f"{fmt(b, 2)} ms ({ratio(a, b)}) | {verdict(a <= 2 * b)} |")
for case in rate_cases:
    a, b = p99_pair(case, "etcd")
    if a and b:
        w(f"| (reference, not a target) etcd's own p99 at half of its peak ({case.split('@')[1]}/s), three "
          f"members against one | {fmt(a, 2)} vs {fmt(b, 2)} ms ({ratio(a, b)}) | – |")
if fo.get("ephd"):
    mx, md = fmed["ephd"]
    done = sum(d.get("kill_count", 0) for d in fo["ephd"])
    planned = meta.get("kills", 0) * len(fo["ephd"])
    short = any(incomplete(d) for d in fo["ephd"])
    tail = f" ({done} of {planned} kills done: runs incomplete)" if short else f" ({done} kills)"
    w(f"| failover: longest write gap after a kill (kill until the member is brought back) ≤ 3 s | {fmt(mx)} ms{tail} | "
      f"{verdict(False if short else (mx is not None and mx <= 3000))} |")
    whole_run = max((d.get("load_max_gap_ms") or 0 for d in fo["ephd"]), default=None)
    w(f"| failover: longest write gap of the whole run (kills and bringing members back) ≤ 3 s | "
      f"{fmt(whole_run)} ms{tail} | {verdict(False if short else (whole_run is not None and whole_run <= 3000))} |")
    if fo.get("etcd"):
        w(f"| failover: median gap no worse than etcd's | {fmt(md)} vs {fmt(fmed['etcd'][1])} ms{tail} | "
          f"{verdict(False if short else (md is not None and fmed['etcd'][1] is not None and md <= fmed['etcd'][1]))} |")
w("")

w("## Every run\n")
for d in runs:
    if d.get("failed"):
        w(f"- {d.get('case')} / {d.get('system')} r{d.get('repeat')}: FAILED {str(d.get('error', ''))[:200]}")
    elif d.get("case") == "failover":
        bad = [f"kill {i + 1}: {k['note']}" for i, k in enumerate(d["kills"]) if k.get("note") != "ok"]
        w(f"- failover / {d['system']} r{d['repeat']}: {'; '.join(bad) + '; ' if bad else ''}"
          f"gaps per kill ms {[k['gap_ms'] for k in d['kills']]}, "
          f"new leader after ms {[k.get('election_ms') for k in d['kills']]}, "
          f"while restarting {[k['recovery_gap_ms'] for k in d['kills']]}, restart until whole s "
          f"{[k['recovery_s'] for k in d['kills']]}, acked {d.get('writes_acked')}, errors {d.get('error_kinds')}")
    else:
        w(f"- {d['case']} / {d['system']} r{d['repeat']}: {fmt(d.get('ops_per_s'))} ops/s, p99 "
          f"{fmt(d.get('lat_p99_ms'), 2)} ms, {fmt(d.get('server_cpu_us_per_op'))} µs/op, member CPU s "
          f"{d.get('member_cpu_s')} ({', '.join(d.get('member_roles', []))}), RSS MB {d.get('member_peak_rss_mb')}, "
          f"terms {d.get('term_before')} → {d.get('term_after')}, errors {d.get('errors')}, other CPU "
          f"{d.get('other_cpu_frac')}, load1 {d.get('load1_before')}")
print("\n".join(out))
