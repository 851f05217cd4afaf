"""The Helm chart, checked with the real tools (run by tests/tests/deploy.rs).

For the default values and every example under the chart's ci/ directory:
helm lint; helm template; every rendered manifest validated against the
Kubernetes schemas (kubernetes-validate, strict: unknown fields fail) for the
oldest and newest Kubernetes the chart supports; and every Strata container's
arguments run through its binary's --check-config, so each flag exists and
each value parses. Bad values must fail at install time with a clear message.

Environment: HELM (helm binary), BIN_DIR (the Strata binaries).
"""

import base64
import os
import re
import tempfile

import kubernetes_validate
import yaml

from common import ROOT, main_of, run

CHART = os.path.join(ROOT, "deploy", "helm", "strata")
HELM = os.environ["HELM"]
BIN_DIR = os.environ["BIN_DIR"]
# Chart.yaml's kubeVersion floor, and the newest schemas we have.
K8S_VERSIONS = ["1.30.0", "1.35.0"]
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet"}



def render(values_files, sets=()):
    args = [HELM, "template", "t", CHART, "--namespace", "strata"]
    for f in values_files:
        args += ["-f", f]
    for s in sets:
        args += ["--set", s]
    return run(args)


def example_values():
    ci = os.path.join(CHART, "ci")
    return sorted(os.path.join(ci, f) for f in os.listdir(ci) if f.endswith(".yaml"))


def pod_spec(doc):
    return doc["spec"]["template"]["spec"]


def expand(arg, env):
    """Kubernetes' $(VAR) expansion in container args."""
    return re.sub(r"\$\(([A-Z_]+)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


def check_flags(docs, token_dir, label):
    """Every Strata container's args pass its binary's --check-config."""
    checked = 0
    sample_env = {"POD_IP": "10.1.2.3", "POD_NAME": "t-strata-master-0", "NODE_NAME": "node-a"}
    for doc in docs:
        if doc["kind"] not in WORKLOADS:
            continue
        spec = pod_spec(doc)
        for c in spec.get("initContainers", []) + spec["containers"]:
            binary = c.get("command", [""])[0]
            if not binary.startswith("strata-"):
                continue
            args = [expand(a, sample_env) for a in c.get("args", [])]
            # The token Secret is mounted at /etc/strata/tokens, the etcd
            # password Secret at /etc/strata/etcd.
            # The etcd TLS Secret at /etc/strata/etcd-tls (replaced first:
            # it starts like the password's path).
            args = [a.replace("/etc/strata/etcd-tls", os.path.join(token_dir, "etcd-tls"))
                    .replace("/etc/strata/tokens", token_dir).replace("/etc/strata/etcd", token_dir) for a in args]
            r = run([os.path.join(BIN_DIR, binary), "--check-config", *args])
            assert r.returncode == 0, f"{label}: {doc['kind']} {doc['metadata']['name']}: {binary} refused its flags:\n{r.stderr}\nargs: {args}"
            checked += 1
    return checked


def check_resources(docs, label):
    """Store nodes request and are limited to capacity + overhead; SSD
    agents to their staging memory (twice with ucx) + overhead."""
    for doc in docs:
        if doc["kind"] not in WORKLOADS:
            continue
        for c in pod_spec(doc)["containers"]:
            if c.get("command") == ["strata-ssd-agent"]:
                # The staging arena, and with ucx the lend window beside it.
                staging = next(a for a in c["args"] if a.startswith("--staging-bytes="))
                staging_mib = int(staging.split("=")[1].removesuffix("MiB"))
                windows = 2 if "--transport=ucx" in c["args"] else 1
                mem = int(c["resources"]["limits"]["memory"].removesuffix("Mi"))
                assert mem > windows * staging_mib, f"{label}: agent limit {mem}Mi <= {windows} x {staging}"
            if c.get("command") != ["strata-store-node"]:
                continue
            cap = next(a for a in c["args"] if a.startswith("--capacity="))
            cap_mib = int(cap.split("=")[1].removesuffix("MiB"))
            limits, requests = c["resources"]["limits"], c["resources"]["requests"]
            assert requests == {**limits, "cpu": requests["cpu"]}, f"{label}: Guaranteed memory"
            if "--huge-pages=true" in c["args"]:
                # The pool is huge pages; memory covers the rest.
                assert limits["hugepages-2Mi"] == f"{cap_mib}Mi", f"{label}: {limits}"
            else:
                assert "hugepages-2Mi" not in limits, f"{label}: {limits}"
                assert int(limits["memory"].removesuffix("Mi")) > cap_mib, f"{label}: limit {limits} <= capacity {cap}"


def check_probes(docs, label):
    """Probes name ports the container declares; Strata containers probe
    /health for liveness and run as non-root."""
    for doc in docs:
        if doc["kind"] not in WORKLOADS:
            continue
        for c in pod_spec(doc)["containers"]:
            ports = {p["name"] for p in c.get("ports", [])}
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                p = c.get(probe)
                if not p:
                    continue
                port = (p.get("httpGet") or p.get("tcpSocket"))["port"]
                assert port in ports, f"{label}: {c['name']} {probe} port {port} not in {ports}"
            if c.get("command", [""])[0].startswith("strata-"):
                assert c["livenessProbe"]["httpGet"]["path"] == "/health"
                assert c["readinessProbe"]["httpGet"]["path"] in ("/ready", "/health")
                sc = c["securityContext"]
                assert sc["runAsNonRoot"] and sc["runAsUser"] != 0, f"{label}: {c['name']} runs as root"


def validate_docs(docs, label):
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            # CRDs: not in the Kubernetes schemas; check their shape here.
            if doc["kind"] == "PodMonitor":
                eps = doc["spec"]["podMetricsEndpoints"]
                assert all(e["port"] == "admin" and e["path"] == "/metrics" for e in eps), eps
            elif doc["kind"] == "PrometheusRule":
                with open(os.path.join(ROOT, "deploy", "prometheus", "rules.yaml")) as f:
                    want = yaml.safe_load(f)["groups"]
                assert doc["spec"]["groups"] == want, f"{label}: the PrometheusRule differs from deploy/prometheus/rules.yaml"
            else:
                raise AssertionError(f"{label}: unexpected {doc['kind']}")
            continue
        for v in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, v, strict=True)
            except kubernetes_validate.ValidationError as e:
                raise AssertionError(
                    f"{label}: {doc['kind']} {doc['metadata']['name']} invalid for Kubernetes {v}: {e.message} at {list(e.path)}"
                ) from None


def check_members_dial_masters_by_name(docs, label):
    """Members must reach a master that is not ready yet (a restarted one
    waits for their reports before it is ready), so they dial the pods
    through the headless Service, which publishes not-ready addresses."""
    headless = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-master-headless")]
    assert headless and headless[0]["spec"].get("publishNotReadyAddresses"), f"{label}: headless master Service"
    for doc in docs:
        if doc["kind"] not in WORKLOADS:
            continue
        for c in pod_spec(doc)["containers"]:
            if c.get("command", [""])[0] in ("strata-store-node", "strata-ssd-agent"):
                master = next(a for a in c["args"] if a.startswith("--master=")).split("=", 1)[1]
                for addr in master.split(","):
                    assert "-master-headless." in addr, f"{label}: {c['name']} dials {addr}, not a master pod by name"


def check_etcd_tls(docs, label):
    """The chart's own etcd serves clients over TLS only and admits only
    certificates its CA signed; the masters present theirs. The generated certificates chain
    to the CA (checked by openssl), the server's names every member."""
    etcds = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"].endswith("-etcd")]
    if not etcds:
        return 0
    (etcd,) = etcds
    name, ns = etcd["metadata"]["name"], "strata"
    args = pod_spec(etcd)["containers"][0]["args"]
    assert "--client-cert-auth" in args, f"{label}: etcd admits clients without a certificate"
    urls = [a.split("=", 1)[1] for a in args if a.split("=", 1)[0] in ("--listen-client-urls", "--advertise-client-urls")]
    assert len(urls) == 2 and all(u.startswith("https://") for u in urls), f"{label}: client URLs {urls}"
    (secret,) = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == f"{name}-tls"]
    with tempfile.TemporaryDirectory() as d:
        for key, b64 in secret["data"].items():
            with open(os.path.join(d, key), "wb") as f:
                f.write(base64.b64decode(b64))
        ca = os.path.join(d, "ca.crt")
        replicas = etcd["spec"]["replicas"]
        for i in range(replicas):
            host = f"{name}-{i}.{name}.{ns}.svc"
            r = run(["openssl", "verify", "-CAfile", ca, "-verify_hostname", host, os.path.join(d, "server.crt")])
            assert r.returncode == 0, f"{label}: etcd's certificate for {host}: {r.stdout}{r.stderr}"
        r = run(["openssl", "verify", "-CAfile", ca, "-purpose", "sslclient", os.path.join(d, "tls.crt")])
        assert r.returncode == 0, f"{label}: the masters' certificate: {r.stdout}{r.stderr}"
        other = run(["openssl", "verify", "-CAfile", ca, "-verify_hostname", "etcd.elsewhere", os.path.join(d, "server.crt")])
        assert other.returncode != 0, f"{label}: etcd's certificate names any host"
    for doc in docs:
        if doc["kind"] == "StatefulSet" and doc["metadata"]["name"].endswith("-master"):
            margs = pod_spec(doc)["containers"][0]["args"]
            etcd_flag = next(a for a in margs if a.startswith("--etcd="))
            assert "https://" in etcd_flag and "http://" not in etcd_flag, f"{label}: {etcd_flag}"
            for flag in ("--etcd-ca-file=", "--etcd-cert-file=", "--etcd-key-file="):
                assert any(a.startswith(flag) for a in margs), f"{label}: master without {flag}"
    return replicas


def check_long_names():
    """A long release name still gives valid object names."""
    r = run([HELM, "template", "a-release-name-as-long-as-anyone-would-ever-write-it", CHART,
             "-f", os.path.join(CHART, "ci", "ha-values.yaml")])
    assert r.returncode == 0, r.stderr
    for d in yaml.safe_load_all(r.stdout):
        if not d:
            continue
        name = d["metadata"]["name"]
        limit = 52 if d["kind"] == "StatefulSet" else 63
        assert len(name) <= limit, f"{d['kind']} {name}: {len(name)} characters (at most {limit})"


def check_bad_values():
    """Bad values fail at install time, saying what is wrong."""
    cases = [
        (["master.leaseTtl=5x"], "leaseTtl"),
        (["master.allocStrategy=fastest"], "allocStrategy"),
        (["master.offloadPolicy=reads:0"], "offloadPolicy"),
        (["storeNode.kind=Deployment"], "kind"),
        (["storeNode.capacityMiB=0"], "capacityMiB"),
        (["mastr.replicas=3"], "mastr"),
        (["master.replicas=3"], "more than one master needs etcd"),
        (["master.replicas=1", "etcd.deploy=true"], "at least 2 masters"),
        (["auth.enabled=false"], "auth.insecure"),
        (["etcd.replicas=2", "etcd.deploy=true", "master.replicas=3"], "replicas"),
        (["tracing.otlpEndpoint=https://otel:4317"], "otlpEndpoint"),
        (["tracing.sampleRatio=1"], "sampleRatio"),
        (["storeNode.transport=rdma"], "transport"),
        (["ssdAgent.transport=rdma"], "transport"),
        (["ssdAgent.env[0].name=LD_PRELOAD"], "name"),
        (["master.replicas=3", "etcd.endpoints=http://e:2379", "etcd.auth.user=strata"], "etcd.auth.passwordSecret"),
        (["master.replicas=3", "etcd.deploy=true", "etcd.auth.user=strata", "etcd.auth.passwordSecret=p"],
         "the chart's own etcd runs without it"),
        (["master.replicas=3", "etcd.endpoints=http://e:2379", "etcd.tls.secret=t"], "not http://"),
        (["master.replicas=3", "etcd.endpoints=https://e:2379"], "needs etcd.tls.secret"),
    ]
    for sets, want in cases:
        r = render([], sets)
        assert r.returncode != 0, f"--set {sets} rendered"
        assert want in r.stderr, f"--set {sets}: {r.stderr}"
    # ...and the edges of what is allowed render.
    for sets in (["master.offloadPolicy=reads:65535"], ["master.replicas=2", "etcd.endpoints=http://e:2379"],
                 ["master.replicas=3", "etcd.deploy=true", "etcd.tls.secret=mine"],
                 ["auth.enabled=false", "auth.insecure=true"], ["ssdAgent.enabled=false"],
                 ["tracing.otlpEndpoint=http://otel:4317"]):
        r = render([], sets)
        assert r.returncode == 0, f"--set {sets}: {r.stderr}"


def main():
    token_dir = tempfile.mkdtemp()
    for name in ("member.token", "client.token", "admin.token", "rdma.token", "password"):
        with open(os.path.join(token_dir, name), "w") as f:
            f.write(os.urandom(32).hex())
    # PEM-shaped stand-ins: --check-config reads them, only a connection
    # would parse them.
    os.mkdir(os.path.join(token_dir, "etcd-tls"))
    for name, kind in (("ca.crt", "CERTIFICATE"), ("tls.crt", "CERTIFICATE"), ("tls.key", "PRIVATE KEY")):
        with open(os.path.join(token_dir, "etcd-tls", name), "w") as f:
            f.write(f"-----BEGIN {kind}-----\nMIIB\n-----END {kind}-----\n")
    sets = [("default", [])] + [(os.path.basename(f), [f]) for f in example_values()]
    assert len(sets) >= 2, "an HA example under ci/"
    for label, files in sets:
        lint = run([HELM, "lint", "--strict", CHART, *sum((["-f", f] for f in files), [])])
        assert lint.returncode == 0, f"{label}: helm lint:\n{lint.stdout}{lint.stderr}"
        r = render(files)
        assert r.returncode == 0, f"{label}: helm template:\n{r.stderr}"
        docs = [d for d in yaml.safe_load_all(r.stdout) if d]
        kinds = sorted({d["kind"] for d in docs})
        validate_docs(docs, label)
        for d in docs:
            if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard"):
                with open(os.path.join(ROOT, "deploy", "grafana", "strata.json")) as f:
                    assert d["data"]["strata.json"].strip() == f.read().strip(), f"{label}: dashboard ConfigMap differs"
        check_probes(docs, label)
        check_resources(docs, label)
        check_members_dial_masters_by_name(docs, label)
        members = check_etcd_tls(docs, label)
        if label == "ha-values.yaml":
            assert members == 3, f"{label}: the chart's own etcd not checked"
        n = check_flags(docs, token_dir, label)
        assert n >= 3, f"{label}: only {n} Strata containers checked"
        print(f"{label}: {len(docs)} manifests valid ({', '.join(kinds)}); {n} containers' flags accepted")
    check_bad_values()
    check_long_names()
    print("bad values refused with clear messages; long release names give valid names")


if __name__ == "__main__":
    main_of(main)
