"""Alerts and runbooks (run by tests/tests/deploy.rs).

- promtool check rules and promtool test rules pass;
- every alert is fired by a promtool test case and also shown quiet on the
  healthy side of its threshold;
- every alert names a severity and a runbook_url that resolves to a file
  under docs/runbooks/ with Symptoms, Diagnosis, Fix and Verify sections;
- every metric an alert or runbook names is exported by a Strata service;
- every command a runbook shows uses real subcommands and flags of the
  Strata binaries (checked against their --help), and every admin API path
  it names is served.

Environment: BIN_DIR (the Strata binaries).
"""

import os
import re

import yaml

from common import ROOT, main_of, run

PROM = os.path.join(ROOT, "deploy", "prometheus")
RUNBOOKS = os.path.join(ROOT, "docs", "runbooks")
BIN_DIR = os.environ["BIN_DIR"]
RUNBOOK_BASE = "https://github.com/strata-kv/strata/blob/main/"
# Runbooks the issue asks for besides the alerts' own.
REQUIRED = [
    "no-leader", "master-failover", "store-node-lost", "ssd-full", "offload-backlog",
    "staging-timeouts", "same-handle-twice", "corrupted-buckets", "credential-rotation",
    "rolling-upgrade",
]
BINARIES = ["strata", "strata-master", "strata-store-node", "strata-ssd-agent"]



def source_text():
    out = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "crates")):
        for f in files:
            if f.endswith(".rs"):
                with open(os.path.join(dirpath, f)) as fh:
                    out.append(fh.read())
    return "\n".join(out)


def exported_metrics(src):
    return set(re.findall(r'"(strata_[a-z0-9_]+)"', src))


def metric_names(text):
    names = set(re.findall(r"\b(strata_(?:master|store_node|ssd_agent)_[a-z0-9_]+)", text))
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}


def check_promtool():
    for args in (["promtool", "check", "rules", "rules.yaml"], ["promtool", "test", "rules", "tests.yaml"]):
        r = run(args, cwd=PROM)
        assert r.returncode == 0, f"{' '.join(args)}:\n{r.stdout}{r.stderr}"


def check_alerts(src):
    rules = yaml.safe_load(open(os.path.join(PROM, "rules.yaml")))
    tests = yaml.safe_load(open(os.path.join(PROM, "tests.yaml")))
    fired, quiet = set(), set()
    for t in tests["tests"]:
        for a in t.get("alert_rule_test", []):
            (fired if a.get("exp_alerts") else quiet).add(a["alertname"])
    exported = exported_metrics(src)
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) >= 10, f"only {len(alerts)} alerts"
    for r in alerts:
        name = r["alert"]
        assert name in fired, f"{name}: no promtool test fires it"
        assert name in quiet, f"{name}: no promtool test shows it quiet below its threshold"
        assert r["labels"]["severity"] in ("critical", "warning", "info"), name
        url = r["annotations"]["runbook_url"]
        assert url.startswith(RUNBOOK_BASE + "docs/runbooks/"), f"{name}: runbook_url {url}"
        path = os.path.join(ROOT, url[len(RUNBOOK_BASE):])
        assert os.path.isfile(path), f"{name}: runbook_url {url} names no file"
        with open(path) as f:
            assert name in f.read(), f"{name}: its runbook {path} does not mention it"
        for m in metric_names(r["expr"]):
            assert m in exported, f"{name}: {m} is not a metric any service exports"
    return alerts


def help_flags(binary, sub=None):
    args = [os.path.join(BIN_DIR, binary)] + ([sub] if sub else []) + ["--help"]
    r = run(args)
    assert r.returncode == 0, f"{args}: {r.stderr}"
    return r.stdout


def check_command(line, where, helps):
    """A shell line that runs a Strata binary (possibly after kubectl exec --)."""
    words = line.replace("\\", " ").split()
    for i, w in enumerate(words):
        if w in BINARIES and (i == 0 or words[i - 1] in ("--", "|", "&&", ";")):
            binary, rest = w, words[i + 1:]
            break
    else:
        return 0
    sub = None
    if binary == "strata":
        top = helps[("strata", None)]
        subs = re.findall(r"^  ([a-z]+)\s", top.split("Commands:")[1].split("Options:")[0], re.M)
        # The first word that is neither a global flag nor its value.
        j = 0
        while j < len(rest):
            if rest[j] in ("--token-file", "--master", "--log-format"):
                j += 2
            elif rest[j].startswith("-"):
                j += 1
            else:
                sub = rest[j]
                break
        assert sub in subs, f"{where}: `strata {sub}` is not a subcommand ({subs}): {line}"
    key = (binary, sub)
    if key not in helps:
        helps[key] = help_flags(binary, sub)
    for w in rest:
        if w.startswith("--"):
            flag = w.split("=")[0]
            assert re.search(rf"(^|\s){re.escape(flag)}[\s,=\[<]", helps[key]) or re.search(
                rf"(^|\s){re.escape(flag)}\b", helps[key]
            ), f"{where}: {binary}{' ' + sub if sub else ''} has no flag {flag}: {line}"
    return 1


def check_runbooks(alerts, src):
    exported = exported_metrics(src)
    routes = set(re.findall(r'"(/api/v1/[a-z]+)', src))
    files = sorted(f for f in os.listdir(RUNBOOKS) if f.endswith(".md") and f != "README.md")
    for name in REQUIRED:
        assert f"{name}.md" in files, f"docs/runbooks/{name}.md is missing"
    index = open(os.path.join(RUNBOOKS, "README.md")).read()
    helps = {("strata", None): help_flags("strata")}
    commands = 0
    for f in files:
        text = open(os.path.join(RUNBOOKS, f)).read()
        where = f"docs/runbooks/{f}"
        assert f"({f})" in index, f"{where} is not listed in docs/runbooks/README.md"
        for section in ("## Symptoms", "## Diagnosis", "## Fix", "## Verify"):
            assert section in text, f"{where}: no '{section}' section"
        for m in metric_names(text):
            assert m in exported, f"{where}: {m} is not a metric any service exports"
        for p in re.findall(r"(/api/v1/[a-z]+)", text):
            assert p in routes, f"{where}: {p} is not an admin API path ({sorted(routes)})"
        # Commands: code blocks and inline code.
        snippets = re.findall(r"```(?:bash)?\n(.*?)```", text, re.S)
        lines = [l for s in snippets for l in s.splitlines()]
        lines += re.findall(r"`([^`\n]*strata[^`\n]*)`", text)
        for line in lines:
            commands += check_command(line.strip(), where, helps)
    assert commands >= 10, f"only {commands} commands checked"
    return len(files), commands


def main():
    src = source_text()
    check_promtool()
    alerts = check_alerts(src)
    n, commands = check_runbooks(alerts, src)
    print(f"{len(alerts)} alerts: promtool checks and unit tests pass, each fired and quiet, each with its runbook")
    print(f"{n} runbooks: sections present, {commands} commands use real subcommands and flags")


if __name__ == "__main__":
    main_of(main)
