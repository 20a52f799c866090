#!/usr/bin/env python3
"""Consistency checks for deploy/ that no generic linter makes.

- every ephd flag and EPHD_* variable used in the manifests and the
  Dockerfile exists in src/config.rs;
- the --etcd-servers-overrides values parse the way kube-apiserver parses
  them (ParseEtcdServersOverrides), name one ephd per resource, and point at
  the static pod's advertised URL;
- the kubeadm ClusterConfiguration fragments have the v1beta4 (list) and
  v1beta3 (map) extraArgs shapes;
- in each pod spec, ports, probes, TLS files, the data directory, volumes
  and security settings agree with each other;
- the Deployment/Service/PDB selectors and ports line up;
- the sharding recipe in deploy/README.md produces a consistent manifest
  (written to --generated-dir for schema validation by lint.sh).

Needs PyYAML (a yamllint dependency). Exit status 1 on any finding.
"""

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
FINDINGS = []

STATIC_CLIENT_PORT = 2479
STATIC_METRICS_PORT = 2481
UID = 65532


def finding(where, msg):
    FINDINGS.append(f"{where}: {msg}")


def load_docs(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def rel(path):
    return str(Path(path).resolve().relative_to(ROOT))


# --------------------------------------------------------------------------
# ephd's flags, from the source of truth.


def ephd_flags():
    """Returns ({flag names}, {env names}) declared in src/config.rs."""
    src = (ROOT / "src" / "config.rs").read_text(encoding="utf-8")
    flags, envs = set(), set()
    for m in re.finditer(r"#\[arg\((.*?)\)\]\s*(?:///[^\n]*\n\s*|#\[[^\n]*\n\s*)*pub (\w+):",
                         src, re.S):
        attrs, field = m.group(1), m.group(2)
        if not re.search(r"\blong\b", attrs):
            continue
        long_m = re.search(r'\blong\s*=\s*"([^"]+)"', attrs)
        flags.add(long_m.group(1) if long_m else field.replace("_", "-"))
        for a in re.findall(r'(?:visible_)?alias(?:es)?\s*=\s*"([^"]+)"', attrs):
            flags.add(a)
        env_m = re.search(r'\benv\s*=\s*"([^"]+)"', attrs)
        if env_m:
            envs.add(env_m.group(1))
    # etcd's flags that ephd takes for compatibility (src/config/etcd.rs),
    # the clustering flags among them; --initial-cluster is added there too.
    compat = (ROOT / "src" / "config" / "etcd.rs").read_text(encoding="utf-8")
    flags.update(re.findall(r'\bc\(\s*"([a-z0-9-]+)"', compat))
    flags.update({"help", "version", "initial-cluster"})
    return flags, envs


def parse_args(argv):
    """--flag=value / --flag value / --flag  ->  {flag: value or True}."""
    out, i = {}, 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("--"):
            i += 1
            continue
        if "=" in a:
            k, v = a[2:].split("=", 1)
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            k, v = a[2:], argv[i + 1]
            i += 1
        else:
            k, v = a[2:], True
        out[k] = v
        i += 1
    return out


# --------------------------------------------------------------------------
# --etcd-servers-overrides, as kube-apiserver parses it.


def parse_overrides(where, value, members=None):
    """Returns {group/resource: [urls]}; records findings on bad syntax.

    `members`: the advertised client URLs of one ephd cluster, which every
    resource must list in full; without it, one URL per resource."""
    result = {}
    for entry in value.split(","):
        if entry.count("#") != 1:
            finding(where, f"override {entry!r}: needs exactly one '#'")
            continue
        gr, servers = entry.split("#")
        if gr.count("/") != 1:
            finding(where, f"override {entry!r}: group/resource needs exactly one '/'")
            continue
        if gr in result:
            finding(where, f"override for {gr} given twice")
        urls = servers.split(";")
        if members is not None:
            if sorted(urls) != sorted(members):
                finding(where, f"{gr}: lists {urls}, not every cluster member {members}")
        elif len(urls) != 1:
            finding(where, f"{gr}: {len(urls)} servers; ephd instances are independent "
                           "stores, list exactly one per resource")
        for u in urls:
            s = urlsplit(u)
            if s.scheme != "https":
                finding(where, f"{gr}: {u!r} is not https:// (the apiserver would talk plaintext)")
            try:
                port = s.port
            except ValueError:
                port = None
            if not s.hostname or port is None:
                finding(where, f"{gr}: {u!r} needs host:port")
        result[gr] = urls
    for gr in result:
        if gr not in ("/events", "coordination.k8s.io/leases"):
            finding(where, f"override for {gr}: ephd is meant for /events and "
                           "coordination.k8s.io/leases only")
    if "events.k8s.io/events" in result:
        finding(where, "events.k8s.io/events has no effect: /events covers both groups")
    return result


def check_apiserver_configs(static_advertised):
    d = DEPLOY / "kube-apiserver"
    values = {}

    v4 = load_docs(d / "kubeadm-v1beta4.yaml")
    w = rel(d / "kubeadm-v1beta4.yaml")
    if len(v4) != 1 or v4[0].get("apiVersion") != "kubeadm.k8s.io/v1beta4" \
            or v4[0].get("kind") != "ClusterConfiguration":
        finding(w, "expected one kubeadm.k8s.io/v1beta4 ClusterConfiguration")
    else:
        extra = (v4[0].get("apiServer") or {}).get("extraArgs")
        if not isinstance(extra, list):
            finding(w, "v1beta4 apiServer.extraArgs must be a list of {name, value}")
        else:
            names = []
            for item in extra:
                if not isinstance(item, dict) or set(item) != {"name", "value"} \
                        or not all(isinstance(x, str) for x in item.values()):
                    finding(w, f"extraArgs item {item!r} is not {{name: str, value: str}}")
                    continue
                if item["name"].startswith("-"):
                    finding(w, f"extraArgs name {item['name']!r}: no leading dashes")
                names.append(item["name"])
                if item["name"] == "etcd-servers-overrides":
                    values[w] = item["value"]
            if len(names) != len(set(names)):
                finding(w, "duplicate extraArgs names")

    v3 = load_docs(d / "kubeadm-v1beta3.yaml")
    w = rel(d / "kubeadm-v1beta3.yaml")
    if len(v3) != 1 or v3[0].get("apiVersion") != "kubeadm.k8s.io/v1beta3" \
            or v3[0].get("kind") != "ClusterConfiguration":
        finding(w, "expected one kubeadm.k8s.io/v1beta3 ClusterConfiguration")
    else:
        extra = (v3[0].get("apiServer") or {}).get("extraArgs")
        if not isinstance(extra, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in extra.items()):
            finding(w, "v1beta3 apiServer.extraArgs must be a map of string to string")
        elif "etcd-servers-overrides" in extra:
            values[w] = extra["etcd-servers-overrides"]

    w = rel(d / "kube-apiserver-flags.txt")
    n = 0
    for line in (d / "kube-apiserver-flags.txt").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^[#\s]*(?:-\s+)?(--etcd-servers-overrides=.*)$", line)
        if not m:
            continue
        # The shell form is quoted; the manifest form is not.
        words = shlex.split(m.group(1))
        if len(words) != 1:
            finding(w, f"not a single shell word: {line}")
            continue
        n += 1
        values[f"{w} #{n}"] = words[0].split("=", 1)[1]

    if len(values) < 5:
        finding("deploy/kube-apiserver", "expected the override in the flags file and both kubeadm files")
    static_host = urlsplit(static_advertised).netloc if static_advertised else None
    for where, value in values.items():
        parsed = parse_overrides(where, value)
        for gr, urls in parsed.items():
            for u in urls:
                netloc = urlsplit(u).netloc
                if gr == "coordination.k8s.io/leases" and netloc.endswith(":2579"):
                    continue  # the sharded example: the leases instance
                if static_host and netloc != static_host:
                    finding(where, f"{gr} -> {netloc}, but the static pod advertises {static_host}")
    kubeadm_values = {v for k, v in values.items() if "kubeadm" in k}
    if len(kubeadm_values) > 1:
        finding("deploy/kube-apiserver", "kubeadm v1beta3 and v1beta4 fragments disagree")


# --------------------------------------------------------------------------
# Pod specs.


def url_port(u):
    try:
        return urlsplit(u).port
    except ValueError:
        return None


def under_mount(path, mounts):
    for m in mounts:
        mp = m["mountPath"].rstrip("/")
        if path == mp or path.startswith(mp + "/"):
            return m
    return None


def check_pod_spec(where, spec, known_flags, *, static, client_port, metrics_port, data_dir,
                   cluster=False):
    containers = spec.get("containers") or []
    if len(containers) != 1:
        finding(where, "expected exactly one container")
        return None
    c = containers[0]
    argv = list(c.get("command") or [])[1:] + list(c.get("args") or [])
    if static and not (c.get("command") or [""])[0].endswith("/ephd"):
        finding(where, "static pod command must start with the ephd binary")
    flags = parse_args(argv)
    for k in flags:
        if k not in known_flags:
            finding(where, f"--{k} is not an ephd flag (src/config.rs)")

    listen = str(flags.get("listen-client-urls", "")).split(",")
    metrics = str(flags.get("listen-metrics-urls", "")).split(",")
    if not flags.get("listen-metrics-urls"):
        finding(where, "--listen-metrics-urls is empty by default; the probes need it")
    for u in listen:
        if url_port(u) != client_port:
            finding(where, f"client URL {u} not on port {client_port}")
        if not u.startswith("https://"):
            finding(where, f"client URL {u} is not https://")
    for u in metrics:
        if url_port(u) != metrics_port:
            finding(where, f"metrics URL {u} not on port {metrics_port}")
        if not u.startswith("http://"):
            finding(where, f"metrics URL {u}: the probes use scheme HTTP")
    for u in str(flags.get("advertise-client-urls", "")).split(","):
        if url_port(u) != client_port or not u.startswith("https://"):
            finding(where, f"advertised URL {u} is not https on port {client_port}")
    for f in ("cert-file", "key-file", "trusted-ca-file") + (() if data_dir is None else ("data-dir",)):
        if not flags.get(f):
            finding(where, f"--{f} missing")
    if str(flags.get("client-cert-auth")) != "true":
        finding(where, "--client-cert-auth=true missing")
    if data_dir is None and "data-dir" in flags:
        finding(where, "this manifest keeps its members in memory: no --data-dir")
    if data_dir is not None and flags.get("data-dir") != data_dir:
        finding(where, f"--data-dir should be {data_dir}")
    if not str(flags.get("lease-adopt-unknown-ttl", "")).isdigit():
        finding(where, "--lease-adopt-unknown-ttl must be whole seconds")

    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
    if ports.get("client") != client_port or ports.get("metrics") != metrics_port:
        finding(where, f"containerPorts {ports} != client {client_port}, metrics {metrics_port}")
    startup_path = "/health?exclude=NOSPACE&serializable=true" if cluster else "/health?exclude=NOSPACE"
    for probe_name, path in (("startupProbe", startup_path), ("livenessProbe", "/livez"),
                             ("readinessProbe", "/readyz")):
        probe = c.get(probe_name)
        if not probe or "httpGet" not in probe:
            finding(where, f"{probe_name}: missing or not httpGet")
            continue
        hg = probe["httpGet"]
        port = hg.get("port")
        port = ports.get(port) if isinstance(port, str) else port
        if port != metrics_port:
            finding(where, f"{probe_name} port {hg.get('port')} is not the metrics port")
        if hg.get("path") != path:
            finding(where, f"{probe_name} path {hg.get('path')} (expected {path})")
        if hg.get("scheme", "HTTP") != "HTTP":
            finding(where, f"{probe_name}: scheme must be HTTP")
        if static:
            host = hg.get("host")
            mhosts = {urlsplit(u).hostname for u in metrics}
            if host not in mhosts and "0.0.0.0" not in mhosts:
                finding(where, f"{probe_name} host {host} is not a metrics listen address {mhosts}")

    mounts = c.get("volumeMounts") or []
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    for m in mounts:
        if m["name"] not in volumes:
            finding(where, f"volumeMount {m['name']} has no volume")
    tls_files = ("cert-file", "key-file", "trusted-ca-file")
    if cluster:
        tls_files += ("peer-cert-file", "peer-key-file", "peer-trusted-ca-file")
    for f in tls_files:
        p = flags.get(f)
        if isinstance(p, str):
            m = under_mount(p, mounts)
            if not m:
                finding(where, f"--{f}={p} is not under any volumeMount")
            elif not m.get("readOnly"):
                finding(where, f"--{f}: mount {m['name']} should be readOnly")
            elif static:
                hp = volumes[m["name"]].get("hostPath", {}).get("path", "")
                if f == "trusted-ca-file" and hp != "/etc/kubernetes/pki/etcd/ca.crt":
                    finding(where, "the CA must come from /etc/kubernetes/pki/etcd/ca.crt")
                if hp == "/etc/kubernetes/pki/etcd":
                    finding(where, "do not mount the whole etcd pki directory (CA and etcd keys)")
    dm = under_mount(str(flags.get("data-dir")), mounts)
    if data_dir is None:
        pass
    elif not dm or dm.get("readOnly"):
        finding(where, "--data-dir must be on a writable volumeMount")
    elif static and volumes[dm["name"]].get("hostPath", {}).get("path") != data_dir:
        finding(where, f"data hostPath should be {data_dir}")

    psc, csc = spec.get("securityContext") or {}, c.get("securityContext") or {}
    if not psc.get("runAsNonRoot") or psc.get("runAsUser") != UID or psc.get("runAsGroup") != UID:
        finding(where, f"pod securityContext: runAsNonRoot, runAsUser/runAsGroup {UID}")
    if not csc.get("readOnlyRootFilesystem") or csc.get("allowPrivilegeEscalation") is not False:
        finding(where, "container securityContext: readOnlyRootFilesystem, no privilege escalation")
    if "ALL" not in ((csc.get("capabilities") or {}).get("drop") or []):
        finding(where, "drop ALL capabilities")
    if spec.get("enableServiceLinks") is not False:
        finding(where, "enableServiceLinks: false (service links inject EPHD_* variables)")
    res = c.get("resources") or {}
    if not (res.get("requests") or {}).get("memory") or not (res.get("limits") or {}).get("memory"):
        finding(where, "memory request and limit required")
    if static:
        if spec.get("hostNetwork") is not True:
            finding(where, "static pod: hostNetwork: true")
        if spec.get("priorityClassName") != "system-node-critical":
            finding(where, "static pod: priorityClassName system-node-critical")
    return flags


def check_static_pod(path, known_flags, *, client_port, metrics_port, data_dir, name):
    where = rel(path) if str(path).startswith(str(ROOT)) else str(path)
    docs = load_docs(path)
    if len(docs) != 1 or docs[0].get("kind") != "Pod":
        finding(where, "expected one Pod")
        return None
    pod = docs[0]
    if pod["metadata"].get("name") != name:
        finding(where, f"metadata.name should be {name}")
    if pod["metadata"].get("namespace") != "kube-system":
        finding(where, "static pods belong in kube-system")
    flags = check_pod_spec(where, pod["spec"], known_flags, static=True,
                           client_port=client_port, metrics_port=metrics_port,
                           data_dir=data_dir)
    if flags:
        adv = str(flags.get("advertise-client-urls", ""))
        hosts = {urlsplit(u).hostname for u in str(flags.get("listen-client-urls")).split(",")}
        if urlsplit(adv).hostname not in hosts:
            finding(where, f"advertised {adv} is not a listen address")
        return adv
    return None


def check_deployment(known_flags):
    d = DEPLOY / "deployment"
    objs = {}
    for p in sorted(d.glob("*.yaml")):
        for doc in load_docs(p):
            objs[(doc.get("kind"), doc.get("metadata", {}).get("name"))] = (p, doc)
    kust = objs.get(("Kustomization", None))
    if kust:
        listed = set(kust[1].get("resources") or [])
        for f in ("namespace.yaml", "deployment.yaml", "service.yaml"):
            if f not in listed:
                finding(rel(kust[0]), f"{f} not in resources")
        for f in listed:
            if not (d / f).exists():
                finding(rel(kust[0]), f"{f} does not exist")
    else:
        finding("deploy/deployment", "kustomization.yaml missing")

    dep = objs.get(("Deployment", "ephd"))
    svc = objs.get(("Service", "ephd"))
    if not dep or not svc:
        finding("deploy/deployment", "Deployment and Service 'ephd' required")
        return
    where, dep = rel(dep[0]), dep[1]
    spec = dep["spec"]
    if spec.get("replicas") != 1:
        finding(where, "replicas must be 1: ephd is a single-member store")
    if (spec.get("strategy") or {}).get("type") != "Recreate":
        finding(where, "strategy must be Recreate: never two ephd pods at once")
    labels = spec["template"]["metadata"]["labels"]
    sel = spec["selector"]["matchLabels"]
    if any(labels.get(k) != v for k, v in sel.items()):
        finding(where, "selector does not match the template labels")
    pspec = spec["template"]["spec"]
    flags = check_pod_spec(where, pspec, known_flags, static=False,
                           client_port=2379, metrics_port=2381, data_dir="/var/lib/ephd")
    secrets = [v for v in pspec.get("volumes") or [] if "secret" in v]
    if not secrets:
        finding(where, "TLS must come from a Secret volume")
    if (pspec.get("securityContext") or {}).get("fsGroup") != UID:
        finding(where, f"fsGroup {UID} needed to read the Secret files as non-root")

    swhere, svc = rel(svc[0]), svc[1]
    if svc["spec"].get("type", "ClusterIP") != "ClusterIP":
        finding(swhere, "Service type must be ClusterIP")
    if any(labels.get(k) != v for k, v in svc["spec"]["selector"].items()):
        finding(swhere, "Service selector does not match the pod labels")
    cports = {p["name"] for p in pspec["containers"][0].get("ports") or []}
    sports = {p["name"]: p for p in svc["spec"]["ports"]}
    if sports.get("client", {}).get("port") != 2379:
        finding(swhere, "client port must be 2379")
    for p in sports.values():
        if p.get("targetPort") not in cports:
            finding(swhere, f"targetPort {p.get('targetPort')} is not a container port name")
    pdb = objs.get(("PodDisruptionBudget", "ephd"))
    if pdb and any(labels.get(k) != v
                   for k, v in pdb[1]["spec"]["selector"]["matchLabels"].items()):
        finding(rel(pdb[0]), "PDB selector does not match the pod labels")
    for key, (p, doc) in objs.items():
        if key[0] != "Kustomization" and key[0] != "Namespace" \
                and doc["metadata"].get("namespace") != "ephd":
            finding(rel(p), "namespace should be ephd")
    return flags


# --------------------------------------------------------------------------
# Dockerfile and README recipes.


def check_dockerfile(known_envs):
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    where = "Dockerfile"
    for env in set(re.findall(r"\b(EPHD_[A-Z_]+)=", text)):
        if env not in known_envs and not env.startswith("EPHD_HEALTHCHECK_"):
            finding(where, f"{env} is not an ephd environment variable (src/config.rs)")
    if not re.search(r"^USER 65532:65532$", text, re.M):
        finding(where, "USER 65532:65532 expected")
    if not re.search(r"^EXPOSE 2379 2381$", text, re.M):
        finding(where, "EXPOSE 2379 2381 expected")
    if 'ENTRYPOINT ["/usr/local/bin/ephd"]' not in text:
        finding(where, 'ENTRYPOINT ["/usr/local/bin/ephd"] expected')
    if "cargo build --release --locked --bin ephd" not in text:
        finding(where, "cargo build --release --locked --bin ephd expected")
    if "HEALTHCHECK" not in text:
        finding(where, "HEALTHCHECK expected")
    ignore = (ROOT / ".dockerignore").read_text(encoding="utf-8")
    for needed in ("Cargo.toml", "Cargo.lock", "build.rs", "proto/", "src/", "benches/",
                   "loadgen/", "ephd-fuzz/", "deploy/docker/", "dist/ephd"):
        if f"!{needed}" not in ignore:
            finding(".dockerignore", f"the build needs {needed}")
    for m in re.finditer(r"^COPY ((?:--\S+ )*)(\S+) ", text, re.M):
        opts, src = m.group(1), m.group(2)
        # dist/ is made by scripts/container-build.sh (the host-built binary).
        if "--from=" not in opts and src != "." and not src.startswith("dist/") \
                and not (ROOT / src).exists():
            finding(where, f"COPY source {src} does not exist")
    for target in ("runtime-base", "runtime-prebuilt", "runtime"):
        if not re.search(rf"^FROM \S+ AS {target}$", text, re.M):
            finding(where, f"stage {target} expected")
    if not text.rstrip().splitlines()[-1].startswith("COPY --from=builder "):
        finding(where, "the last stage (the default target) must copy the builder's binary")
    # Secure by default: the image's ENV serves TLS with client certificates,
    # and plaintext is never the default.
    env = dict(re.findall(r"\b(EPHD_[A-Z_]+)=(\S+)", text.split("\nENV ", 1)[-1].split("\n\n")[0]))
    if not env.get("EPHD_LISTEN_CLIENT_URLS", "").startswith("https://"):
        finding(where, "ENV EPHD_LISTEN_CLIENT_URLS must be https:// (secure by default)")
    if env.get("EPHD_CLIENT_CERT_AUTH") != "true":
        finding(where, "ENV EPHD_CLIENT_CERT_AUTH=true expected (secure by default)")
    if re.search(r"^ENV .*EPHD_ALLOW_INSECURE_PLAINTEXT", text, re.M | re.S):
        finding(where, "EPHD_ALLOW_INSECURE_PLAINTEXT must not be an image default")
    for var in ("EPHD_CERT_FILE", "EPHD_KEY_FILE", "EPHD_TRUSTED_CA_FILE"):
        if not env.get(var, "").startswith("/etc/ephd/tls/"):
            finding(where, f"ENV {var} should be under /etc/ephd/tls/")
    return env


def check_image_defaults_match_deployment(env, flags):
    """The Deployment's TLS flags repeat the image's defaults (one layout)."""
    if not env or not flags:
        return
    for flag, var in (("listen-client-urls", "EPHD_LISTEN_CLIENT_URLS"),
                      ("cert-file", "EPHD_CERT_FILE"), ("key-file", "EPHD_KEY_FILE"),
                      ("trusted-ca-file", "EPHD_TRUSTED_CA_FILE"),
                      ("client-cert-auth", "EPHD_CLIENT_CERT_AUTH"),
                      ("listen-metrics-urls", "EPHD_LISTEN_METRICS_URLS")):
        if str(flags.get(flag)) != env.get(var):
            finding("deploy/deployment/deployment.yaml",
                    f"--{flag}={flags.get(flag)} differs from the image's {var}={env.get(var)}")


def sharding_recipe(generated_dir, known_flags, static_manifest):
    """Runs the sed recipe from deploy/README.md on the static pod."""
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Sharding", 1)
    if len(section) != 2:
        finding("deploy/README.md", "no Sharding section")
        return
    blocks = re.findall(r"```\n(.*?)```", section[1], re.S)
    cmd = next((b for b in blocks if "ephd-leases.yaml" in b), None)
    if not cmd:
        finding("deploy/README.md", "no sharding sed recipe")
        return
    sed = re.search(r"^sed .*?ephd-leases\.yaml$", cmd, re.S | re.M)
    if not sed:
        finding("deploy/README.md", "sharding recipe: no sed command")
        return
    generated_dir.mkdir(parents=True, exist_ok=True)
    out = generated_dir / "ephd-leases.yaml"
    script = sed.group(0).replace("/etc/kubernetes/manifests/ephd.yaml", shlex.quote(str(static_manifest)))
    script = script.replace("/etc/kubernetes/manifests/ephd-leases.yaml", shlex.quote(str(out)))
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        finding("deploy/README.md", f"sharding recipe failed: {r.stderr.strip()}")
        return
    check_static_pod(out, known_flags, client_port=2579, metrics_port=2581,
                     data_dir="/var/lib/ephd-leases", name="ephd-leases")
    text = out.read_text(encoding="utf-8")
    if "--name=cp-1-leases" not in text or "- name: ephd-leases" not in text:
        finding("deploy/README.md", "sharding recipe: member/container name not changed")
    if "/etc/kubernetes/pki/ephd\n" not in text:
        finding("deploy/README.md", "sharding recipe: certificate directory changed")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--generated-dir", type=Path, default=ROOT / "target" / "deploy-lint" / "generated")
    args = ap.parse_args()

    known_flags, known_envs = ephd_flags()
    if len(known_flags) < 10:
        finding("src/config.rs", f"found only {len(known_flags)} flags; parser out of date?")
    static = DEPLOY / "static-pod" / "ephd.yaml"
    advertised = check_static_pod(static, known_flags, client_port=STATIC_CLIENT_PORT,
                                  metrics_port=STATIC_METRICS_PORT, data_dir="/var/lib/ephd",
                                  name="ephd")
    check_apiserver_configs(advertised)
    deployment_flags = check_deployment(known_flags)
    image_env = check_dockerfile(known_envs)
    check_image_defaults_match_deployment(image_env, deployment_flags)
    sharding_recipe(args.generated_dir, known_flags, static)
    import lint_cluster  # deploy/cluster/
    lint_cluster.check(sys.modules[__name__], known_flags)

    for f in FINDINGS:
        print(f"lint_checks: {f}")
    if FINDINGS:
        print(f"lint_checks: {len(FINDINGS)} finding(s)")
        return 1
    print("lint_checks: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
