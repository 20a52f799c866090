"""Consistency checks for deploy/cluster/ (ephd's cluster mode), run by
lint_checks.py:

- the static pod template renders (render.sh) into three member manifests
  whose pod specs pass the same checks as the single-member static pod,
  with the cluster's own: https:// peer URLs on the peer port, peer TLS
  files under read-only mounts, --peer-client-cert-auth=true, the same
  --initial-cluster and token on every member, naming each member at its
  advertised peer URL, and --data-dir on the node's /var/lib/ephd (so a
  whole-cluster restart resumes its saved state);
- the StatefulSet, its headless Service, client Service and
  PodDisruptionBudget line up (Parallel start, names from the headless
  Service's DNS, publishNotReadyAddresses, one member per node, at most one
  unavailable);
- the cluster's kube-apiserver overrides list every member for each
  resource.
"""

import subprocess
from urllib.parse import urlsplit

# lint_checks, which runs as __main__: passed in by check(), so findings
# land in its list (importing it by name would load a second copy).
lc = None
STATIC_PEER_PORT = 2480
NODES = (("cp-1", "192.0.2.10"), ("cp-2", "192.0.2.11"), ("cp-3", "192.0.2.12"))


def check_cluster_flags(where, flags, *, peer_port):
    for u in str(flags.get("listen-peer-urls", "")).split(","):
        if not u.startswith("https://") or lc.url_port(u) != peer_port:
            lc.finding(where, f"peer URL {u} is not https on port {peer_port}")
    for f in ("peer-cert-file", "peer-key-file", "peer-trusted-ca-file",
              "initial-cluster", "initial-cluster-token", "initial-advertise-peer-urls"):
        if not flags.get(f):
            lc.finding(where, f"--{f} missing")
    if str(flags.get("peer-client-cert-auth")) != "true":
        lc.finding(where, "--peer-client-cert-auth=true missing")
    if flags.get("initial-cluster-state") != "new":
        lc.finding(where, "--initial-cluster-state=new expected")
    members = {}
    for entry in str(flags.get("initial-cluster", "")).split(","):
        name, _, url = entry.partition("=")
        if not url.startswith("https://") or lc.url_port(url) != peer_port:
            lc.finding(where, f"--initial-cluster member {entry} is not https on port {peer_port}")
        members[name] = url
    if len(members) not in (3, 5):
        lc.finding(where, f"--initial-cluster has {len(members)} members; use 3 or 5")
    return members


def check_static_pods(known_flags):
    template = lc.DEPLOY / "cluster" / "static-pod" / "ephd-member.yaml"
    render = lc.DEPLOY / "cluster" / "static-pod" / "render.sh"
    seen, advertised = [], []
    for name, ip in NODES:
        where = f"{lc.rel(template)} rendered for {name}"
        out = subprocess.run(["bash", str(render), name, ip], capture_output=True, text=True)
        if out.returncode != 0:
            lc.finding(where, f"render.sh failed: {out.stderr.strip()}")
            continue
        docs = [d for d in lc.yaml.safe_load_all(out.stdout) if d is not None]
        if len(docs) != 1 or docs[0].get("kind") != "Pod":
            lc.finding(where, "expected one Pod")
            continue
        pod = docs[0]
        if pod["metadata"].get("namespace") != "kube-system":
            lc.finding(where, "static pods belong in kube-system")
        flags = lc.check_pod_spec(where, pod["spec"], known_flags, static=True,
                                  client_port=lc.STATIC_CLIENT_PORT,
                                  metrics_port=lc.STATIC_METRICS_PORT,
                                  data_dir="/var/lib/ephd", cluster=True)
        if not flags:
            continue
        members = check_cluster_flags(where, flags, peer_port=STATIC_PEER_PORT)
        if flags.get("name") != name:
            lc.finding(where, f"--name is {flags.get('name')}, not {name}")
        own = f"https://{ip}:{STATIC_PEER_PORT}"
        if members.get(name) != own or flags.get("initial-advertise-peer-urls") != own:
            lc.finding(where, f"{name} is not at {own} in --initial-cluster and "
                              "--initial-advertise-peer-urls")
        if flags.get("listen-peer-urls") != own:
            lc.finding(where, f"--listen-peer-urls should be {own}")
        ports = {p.get("name"): p.get("containerPort")
                 for p in pod["spec"]["containers"][0].get("ports") or []}
        if ports.get("peer") != STATIC_PEER_PORT:
            lc.finding(where, f"containerPort peer should be {STATIC_PEER_PORT}")
        seen.append((flags.get("initial-cluster"), flags.get("initial-cluster-token")))
        advertised.append(str(flags.get("advertise-client-urls")))
    if len(set(seen)) > 1:
        lc.finding(lc.rel(template), "members disagree on --initial-cluster or the token")
    return advertised


def check_statefulset(known_flags):
    d = lc.DEPLOY / "cluster" / "statefulset"
    objs = {}
    for f in sorted(d.glob("*.yaml")):
        if f.name == "kustomization.yaml":
            continue
        for doc in lc.load_docs(f):
            objs[(doc.get("kind"), doc["metadata"]["name"])] = (lc.rel(f), doc)
    sts_where, sts = objs.get(("StatefulSet", "ephd"), (None, None))
    if not sts:
        lc.finding(lc.rel(d), "no StatefulSet ephd")
        return
    spec = sts["spec"]
    ns = sts["metadata"].get("namespace")
    if spec.get("podManagementPolicy") != "Parallel":
        lc.finding(sts_where, "podManagementPolicy: Parallel (members must start together)")
    replicas = spec.get("replicas")
    if replicas not in (3, 5):
        lc.finding(sts_where, f"replicas {replicas}: use 3 or 5")
    peer_where, peer = objs.get(("Service", spec.get("serviceName")), (None, None))
    if not peer:
        lc.finding(sts_where, f"serviceName {spec.get('serviceName')} has no Service")
    else:
        if peer["spec"].get("clusterIP") != "None":
            lc.finding(peer_where, "the peer Service must be headless (clusterIP: None)")
        if peer["spec"].get("publishNotReadyAddresses") is not True:
            lc.finding(peer_where, "publishNotReadyAddresses: true (peers meet before ready)")
    pod = spec["template"]["spec"]
    # A claim template is one more volume of every pod.
    claims = [t["metadata"]["name"] for t in spec.get("volumeClaimTemplates") or []]
    if "data" not in claims:
        lc.finding(sts_where, "a volumeClaimTemplate 'data' keeps each member's --data-dir")
    pod = dict(pod, volumes=(pod.get("volumes") or [])
               + [{"name": n, "persistentVolumeClaim": {"claimName": n}} for n in claims])
    flags = lc.check_pod_spec(sts_where, pod, known_flags, static=False, client_port=2379,
                              metrics_port=2381, data_dir="/var/lib/ephd", cluster=True)
    if flags:
        members = check_cluster_flags(sts_where, flags, peer_port=2380)
        domain = f"{spec.get('serviceName')}.{ns}.svc"
        want = {f"ephd-{i}": f"https://ephd-{i}.{domain}:2380" for i in range(replicas or 0)}
        if members != want:
            lc.finding(sts_where, f"--initial-cluster {members} should be {want}")
        if flags.get("name") != "$(POD_NAME)":
            lc.finding(sts_where, "--name=$(POD_NAME)")
        if flags.get("initial-advertise-peer-urls") != f"https://$(POD_NAME).{domain}:2380":
            lc.finding(sts_where, "--initial-advertise-peer-urls must be built from POD_NAME")
    anti = ((pod.get("affinity") or {}).get("podAntiAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or []
    if not any(t.get("topologyKey") == "kubernetes.io/hostname" for t in anti):
        lc.finding(sts_where, "required pod anti-affinity on kubernetes.io/hostname")
    pdb_where, pdb = objs.get(("PodDisruptionBudget", "ephd"), (None, None))
    if not pdb or pdb["spec"].get("maxUnavailable") != 1:
        lc.finding(pdb_where or lc.rel(d), "a PodDisruptionBudget with maxUnavailable: 1")
    sel = spec["selector"]["matchLabels"]
    for (kind, name), (where, obj) in objs.items():
        if kind == "Service" and obj["spec"].get("selector") != sel:
            lc.finding(where, f"Service {name} selector differs from the StatefulSet's")
        if kind == "PodDisruptionBudget" and obj["spec"]["selector"].get("matchLabels") != sel:
            lc.finding(where, "PDB selector differs from the StatefulSet's")


def check_overrides(advertised):
    d = lc.DEPLOY / "cluster" / "kube-apiserver"
    values = {}
    v4 = lc.load_docs(d / "kubeadm-v1beta4.yaml")
    for item in ((v4[0].get("apiServer") or {}).get("extraArgs") or []) if v4 else []:
        if item.get("name") == "etcd-servers-overrides":
            values[lc.rel(d / "kubeadm-v1beta4.yaml")] = item.get("value")
    v3 = lc.load_docs(d / "kubeadm-v1beta3.yaml")
    extra = ((v3[0].get("apiServer") or {}).get("extraArgs") or {}) if v3 else {}
    if "etcd-servers-overrides" in extra:
        values[lc.rel(d / "kubeadm-v1beta3.yaml")] = extra["etcd-servers-overrides"]
    w = lc.rel(d / "kube-apiserver-flags.txt")
    for n, line in enumerate((d / "kube-apiserver-flags.txt").read_text().splitlines()):
        m = lc.re.match(r"^[#\s]*(?:-\s+)?(--etcd-servers-overrides=.*)$", line)
        if m:
            values[f"{w} line {n + 1}"] = lc.shlex.split(m.group(1))[0].split("=", 1)[1]
    if len(values) < 4:
        lc.finding(lc.rel(d), "expected the override in the flags file (both forms) and both "
                              "kubeadm files")
    for where, value in values.items():
        parsed = lc.parse_overrides(where, value, members=advertised)
        if set(parsed) != {"/events", "coordination.k8s.io/leases"}:
            lc.finding(where, "override both /events and coordination.k8s.io/leases")
        for urls in parsed.values():
            for u in urls:
                if urlsplit(u).port != lc.STATIC_CLIENT_PORT:
                    lc.finding(where, f"{u} is not on the client port {lc.STATIC_CLIENT_PORT}")


def check(module, known_flags):
    """Runs every check; `module` is lint_checks (for its helpers and its
    list of findings)."""
    global lc
    lc = module
    advertised = check_static_pods(known_flags)
    check_statefulset(known_flags)
    check_overrides(advertised)
