"""The image ships what the chart runs (run by tests/tests/deploy.rs).

This machine cannot pull base images, so the Dockerfile is checked
statically against the chart's rendered manifests: every binary a container
runs is built and copied onto the PATH, the runtime user is not root, every
port a Strata container declares is exposed, and the health check asks
/health. Also: the binaries it builds are this workspace's.

Environment: HELM (helm binary).
"""

import os
import re

import yaml

from common import ROOT, main_of, run

CHART = os.path.join(ROOT, "deploy", "helm", "strata")
DOCKERFILE = os.path.join(ROOT, "deploy", "Dockerfile")


def instructions(text):
    """(INSTRUCTION, arguments) per logical line, continuations joined."""
    out, cur = [], ""
    for line in text.splitlines():
        s = line.strip()
        if not cur and (not s or s.startswith("#")):
            continue
        cur += " " + s.rstrip("\\").strip() if s.endswith("\\") else " " + s
        if not s.endswith("\\"):
            word, _, rest = cur.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            cur = ""
    return out


def chart_containers():
    docs = []
    for extra in ([], ["-f", os.path.join(CHART, "ci", "ha-values.yaml")]):
        r = run([os.environ["HELM"], "template", "t", CHART, *extra])
        assert r.returncode == 0, r.stderr
        docs += [d for d in yaml.safe_load_all(r.stdout) if d]
    for d in docs:
        if d["kind"] in ("StatefulSet", "DaemonSet", "Deployment"):
            spec = d["spec"]["template"]["spec"]
            for c in spec.get("initContainers", []) + spec["containers"]:
                yield c


def main():
    ins = instructions(open(DOCKERFILE).read())
    stages = [i for i, (w, _) in enumerate(ins) if w == "FROM"]
    assert len(stages) >= 2, "a multi-stage build"
    runtime = ins[stages[-1]:]
    copied = set()
    for w, a in runtime:
        if w == "COPY" and "/usr/local/bin/" in a:
            copied |= {os.path.basename(p) for p in a.split() if p.startswith("/out/")}
    built = set(re.findall(r"--bin (\S+)", " ".join(a for w, a in ins[:stages[-1]] if w == "RUN")))
    users = [a for w, a in runtime if w == "USER"]
    assert users, "the runtime stage sets USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]}: a numeric non-root uid"
    exposed = {int(p.split("/")[0]) for w, a in runtime if w == "EXPOSE" for p in a.split()}
    health = [a for w, a in runtime if w == "HEALTHCHECK"]
    assert health and "/health" in health[-1], "a /health check"
    strata_images = set()
    for c in chart_containers():
        cmd = c.get("command", [""])[0]
        if c["image"].split(":")[0].endswith("/strata") or cmd.startswith("strata"):
            strata_images.add(c["image"])
            assert cmd in copied or cmd in ("chown",), f"the chart runs {cmd}; the image copies {sorted(copied)}"
            if cmd.startswith("strata"):
                assert cmd in built, f"{cmd} is not built ({sorted(built)})"
                assert c["securityContext"]["runAsUser"] == int(uid), f"{cmd}: chart uid vs image USER {uid}"
                for p in c.get("ports", []):
                    assert p["containerPort"] in exposed, f"{cmd} port {p['containerPort']} not EXPOSEd ({sorted(exposed)})"
    assert len(strata_images) == 1, f"one image for every service: {strata_images}"
    # The binaries it builds exist in this workspace.
    for b in built:
        found = any(
            f'name = "{b}"' in open(os.path.join(ROOT, "crates", d, "Cargo.toml")).read()
            for d in os.listdir(os.path.join(ROOT, "crates"))
            if os.path.exists(os.path.join(ROOT, "crates", d, "Cargo.toml"))
        )
        assert found, f"no workspace binary named {b}"
    print(f"Dockerfile: builds and copies {sorted(copied)}, runs as uid {uid}, exposes {sorted(exposed)}")


if __name__ == "__main__":
    main_of(main)
