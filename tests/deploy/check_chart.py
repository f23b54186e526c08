#!/usr/bin/env python3
"""Static checks of the deployment: the Helm chart and the Dockerfile.

No helm binary or cluster is needed: the chart is rendered by render/main.go
(Go text/template + sprig, Helm's engine semantics) for the default values and
ci/production-values.yaml; every manifest must parse and carry the fields its
kind requires; the rendered kdedup config must pass `kdedup validate`; values
files must validate against values.schema.json (and a typo must not); the
Dockerfile's runtime packages must cover every shared library the built binary
links. When a helm binary is on PATH, `helm lint` and `helm template` run too.

usage: check_chart.py SOURCE_DIR KDEDUP_BINARY WORK_DIR
"""
import json
import os
import re
import shutil
import subprocess
import sys

import jsonschema
import yaml

SRC, BINARY, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
CHART = os.path.join(SRC, "helm", "kdedup")
GOCODE = "/usr/share/gocode/src"  # where Debian's golang-*-dev packages install
failures = []
passed = 0


def check(cond, what):
    global passed
    if cond:
        passed += 1
    else:
        failures.append(what)
        print("FAIL:", what)


def build_renderer():
    """GOPATH-mode build against Debian's Go packages, offline."""
    gopath = os.path.join(WORK, "gopath")
    src = os.path.join(gopath, "src")
    shutil.rmtree(gopath, ignore_errors=True)
    os.makedirs(os.path.join(src, "github.com", "Masterminds", "semver"))
    for name in os.listdir(GOCODE):
        if name != "github.com":
            os.symlink(os.path.join(GOCODE, name), os.path.join(src, name))
    for name in os.listdir(os.path.join(GOCODE, "github.com")):
        if name != "Masterminds":
            os.symlink(os.path.join(GOCODE, "github.com", name), os.path.join(src, "github.com", name))
    mm = os.path.join(GOCODE, "github.com", "Masterminds")
    for name in ("sprig", "goutils"):
        os.symlink(os.path.join(mm, name), os.path.join(src, "github.com", "Masterminds", name))
    # sprig imports semver by its module path .../semver/v3.
    os.symlink(os.path.join(mm, "semver"), os.path.join(src, "github.com", "Masterminds", "semver", "v3"))
    os.makedirs(os.path.join(src, "render"))
    shutil.copy(os.path.join(SRC, "tests", "deploy", "render", "main.go"), os.path.join(src, "render"))
    env = dict(os.environ, GO111MODULE="off", GOPATH=gopath, GOFLAGS="", GOPROXY="off", GOENV="off",
               GOCACHE=os.path.join(WORK, "gocache"))
    out = os.path.join(WORK, "render")
    subprocess.run(["go", "build", "-o", out, "."], cwd=os.path.join(src, "render"), env=env, check=True)
    return out


def render(renderer, values_files, tag):
    args = [renderer, "-chart", CHART, "-notes", os.path.join(WORK, tag + "-NOTES.txt")]
    for f in values_files:
        args += ["-f", f]
    res = subprocess.run(args, capture_output=True, text=True)
    check(res.returncode == 0, f"{tag}: chart renders ({res.stderr.strip()})")
    with open(os.path.join(WORK, tag + ".yaml"), "w") as f:
        f.write(res.stdout)
    docs = []
    try:
        docs = [d for d in yaml.safe_load_all(res.stdout) if d is not None]
    except yaml.YAMLError as e:
        check(False, f"{tag}: rendered manifests parse as YAML: {e}")
    return docs


REQUIRED = {
    "ConfigMap": [["data"]],
    "Service": [["spec", "ports"], ["spec", "selector"]],
    "StatefulSet": [["spec", "selector", "matchLabels"], ["spec", "serviceName"], ["spec", "template", "spec", "containers"]],
    "PodDisruptionBudget": [["spec", "selector"]],
    "HorizontalPodAutoscaler": [["spec", "scaleTargetRef"], ["spec", "maxReplicas"]],
    "ServiceMonitor": [["spec", "endpoints"], ["spec", "selector"]],
    "PrometheusRule": [["spec", "groups"]],
    "Pod": [["spec", "containers"]],
}


def dig(obj, path):
    for p in path:
        if not isinstance(obj, dict) or p not in obj:
            return None
        obj = obj[p]
    return obj


def check_manifests(docs, tag, values):
    kinds = {}
    for d in docs:
        kind = d.get("kind")
        name = dig(d, ["metadata", "name"])
        check(bool(d.get("apiVersion")) and bool(kind) and bool(name), f"{tag}: apiVersion/kind/metadata.name in {d.get('kind')}")
        check(name is None or (len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name)), f"{tag}: {kind} name '{name}' is a DNS name")
        for path in REQUIRED.get(kind, []):
            check(dig(d, path) not in (None, [], {}), f"{tag}: {kind}/{name} has {'.'.join(path)}")
        kinds.setdefault(kind, []).append(d)

    sts = kinds.get("StatefulSet", [None])[0]
    check(sts is not None, f"{tag}: one StatefulSet")
    if sts is None:
        return
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    check(all(labels.get(k) == v for k, v in spec["selector"]["matchLabels"].items()), f"{tag}: selector matches pod labels")
    check(spec.get("podManagementPolicy") == "Parallel", f"{tag}: parallel pod management")
    check(any(s["metadata"]["name"] == spec["serviceName"] and s["spec"].get("clusterIP") == "None" for s in kinds.get("Service", [])),
          f"{tag}: headless governing Service exists")
    check(pod.get("automountServiceAccountToken") is False, f"{tag}: no service-account token")
    psc = pod.get("securityContext", {})
    check(psc.get("runAsNonRoot") is True and dig(psc, ["seccompProfile", "type"]) == "RuntimeDefault", f"{tag}: non-root + seccomp RuntimeDefault")
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    m = re.fullmatch(r"([0-9]+)(ms|s|m|h|d)", str(values["config"].get("shutdown_timeout", "30s")))
    shutdown = int(m.group(1)) * units[m.group(2)] if m else 30
    check(pod.get("terminationGracePeriodSeconds", 0) > shutdown,
          f"{tag}: terminationGracePeriodSeconds exceeds shutdown_timeout ({shutdown}s): graceful commit + snapshot")
    check("checksum/config" in spec["template"]["metadata"].get("annotations", {}), f"{tag}: config checksum annotation")
    for c in pod["containers"] + pod.get("initContainers", []):
        sc = c.get("securityContext", {})
        check(sc.get("readOnlyRootFilesystem") is True and dig(sc, ["capabilities", "drop"]) == ["ALL"] and sc.get("allowPrivilegeEscalation") is False,
              f"{tag}: container {c['name']} hardened")
        check(bool(c.get("image")) and bool(c.get("name")), f"{tag}: container has name and image")
    main = next(c for c in pod["containers"] if c["name"] == "kdedup")
    port = values["metrics"]["port"]
    check(main["args"][:1] == ["run"] and "--config" in main["args"], f"{tag}: container runs kdedup run --config")
    check(dig(main, ["livenessProbe", "httpGet", "path"]) == "/healthz", f"{tag}: liveness /healthz")
    check(dig(main, ["readinessProbe", "httpGet", "path"]) == "/readyz", f"{tag}: readiness /readyz")
    check(dig(main, ["startupProbe", "httpGet", "path"]) == "/healthz", f"{tag}: startup probe")
    check(any(p["containerPort"] == port and p["name"] == "metrics" for p in main["ports"]), f"{tag}: metrics port {port}")
    mounts = {m["mountPath"] for m in main["volumeMounts"]}
    check("/tmp" in mounts and values["stateDir"] in mounts, f"{tag}: /tmp and state dir mounted")
    env = {e["name"]: e for e in main["env"]}
    check(dig(env.get("POD_NAME", {}), ["valueFrom", "fieldRef", "fieldPath"]) == "metadata.name", f"{tag}: POD_NAME from the pod name")
    if values["persistence"]["enabled"]:
        check(dig(spec, ["volumeClaimTemplates"]) and spec["volumeClaimTemplates"][0]["metadata"]["name"] == "state", f"{tag}: state volumeClaimTemplate")
    if values["secretEnv"]["existingSecret"]:
        for var, key in values["secretEnv"]["keys"].items():
            ref = dig(env.get(var, {}), ["valueFrom", "secretKeyRef"])
            check(ref == {"name": values["secretEnv"]["existingSecret"], "key": key}, f"{tag}: {var} from the Secret")

    dash = [c for c in kinds.get("ConfigMap", []) if dig(c, ["metadata", "labels", "grafana_dashboard"]) == "1"]
    if values["metrics"]["dashboards"]["enabled"]:
        check(len(dash) == 1, f"{tag}: dashboard ConfigMap labelled grafana_dashboard")
        for c in dash:
            for name, text in c["data"].items():
                try:
                    json.loads(text)
                    check(True, "")
                except ValueError as e:
                    check(False, f"{tag}: dashboard {name} is JSON: {e}")
    if values["metrics"]["prometheusRule"]["enabled"]:
        rules = kinds.get("PrometheusRule", [])
        check(len(rules) == 1 and all("rules" in g for g in rules[0]["spec"]["groups"]), f"{tag}: PrometheusRule with rule groups")
    if values["metrics"]["serviceMonitor"]["enabled"]:
        sm = kinds.get("ServiceMonitor", [])
        check(len(sm) == 1 and sm[0]["spec"]["endpoints"][0]["path"] == "/metrics", f"{tag}: ServiceMonitor scrapes /metrics")
        if sm:
            sel = sm[0]["spec"]["selector"]["matchLabels"]
            check(any(all(dig(s, ["metadata", "labels", k]) == v for k, v in sel.items()) for s in kinds.get("Service", [])),
                  f"{tag}: ServiceMonitor selects the metrics Service")
    if values["podDisruptionBudget"]["enabled"]:
        check(len(kinds.get("PodDisruptionBudget", [])) == 1, f"{tag}: PodDisruptionBudget")
    tests = [p for p in kinds.get("Pod", []) if dig(p, ["metadata", "annotations", "helm.sh/hook"]) == "test"]
    check(len(tests) == 1 and "/readyz" in " ".join(tests[0]["spec"]["containers"][0]["command"]), f"{tag}: helm test hook checks /readyz")

    # The rendered config passes kdedup validate with the pod's environment.
    cm = next(c for c in kinds["ConfigMap"] if "kdedup.yaml" in c.get("data", {}))
    # The filters' memory budget is memoryBudget.percentOfLimit of the memory
    # limit, unless the config sets memory.max_bytes itself.
    rendered = yaml.safe_load(cm["data"]["kdedup.yaml"])
    limit = quantity_bytes(dig(values, ["resources", "limits", "memory"]))
    percent = dig(values, ["memoryBudget", "percentOfLimit"]) or 0
    explicit = dig(values, ["config", "memory", "max_bytes"])
    expect = explicit if explicit is not None else (round(limit * percent / 100) if limit and percent else None)
    check(dig(rendered, ["memory", "max_bytes"]) == expect,
          f"{tag}: memory.max_bytes {dig(rendered, ['memory', 'max_bytes'])} is {percent}% of the memory limit ({expect})")
    cfg_path = os.path.join(WORK, tag + "-kdedup.yaml")
    with open(cfg_path, "w") as f:
        f.write(cm["data"]["kdedup.yaml"])
    run_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "POD_NAME": "kdedup-0"}
    for e in main["env"]:
        run_env[e["name"]] = e.get("value", "secret-from-kubernetes")
    res = subprocess.run([BINARY, "validate", "--config", cfg_path], capture_output=True, text=True, env=run_env)
    check(res.returncode == 0, f"{tag}: rendered config passes kdedup validate: {res.stderr.strip()}")
    print(f"{tag}: kdedup validate -> {res.stdout.strip()}")
    return cm


def quantity_bytes(q):
    """Bytes of a Kubernetes memory quantity ("2Gi", "1536Mi", "2G"); 0 for none."""
    if q is None:
        return 0
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(q).strip())
    scale = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    return float(m.group(1)) * scale[m.group(2)] if m else 0


def merged_values(files):
    vals = yaml.safe_load(open(os.path.join(CHART, "values.yaml")))
    def merge(d, s):
        for k, v in s.items():
            if v is None:
                d.pop(k, None)
            elif isinstance(v, dict) and isinstance(d.get(k), dict):
                merge(d[k], v)
            else:
                d[k] = v
        return d
    for f in files:
        merge(vals, yaml.safe_load(open(f)) or {})
    return vals


def check_values_schema():
    schema = json.load(open(os.path.join(CHART, "values.schema.json")))
    jsonschema.Draft7Validator.check_schema(schema)
    for f in ["values.yaml", "ci/production-values.yaml"]:
        errs = list(jsonschema.Draft7Validator(schema).iter_errors(merged_values([os.path.join(CHART, f)]) if f != "values.yaml" else yaml.safe_load(open(os.path.join(CHART, f)))))
        check(not errs, f"{f} validates against values.schema.json: {[e.message for e in errs]}")
    for typo in [{"replicaCont": 3}, {"metrics": {"serviceMonitr": {"enabled": True}}}, {"persistence": {"size": "lots"}},
                 {"config": {"filter": {"type": "cuckoo"}}}]:
        vals = merged_values([])
        def merge(d, s):
            for k, v in s.items():
                d[k] = merge(d.get(k, {}), v) if isinstance(v, dict) and isinstance(d.get(k), dict) else v
            return d
        merge(vals, typo)
        errs = list(jsonschema.Draft7Validator(schema).iter_errors(vals))
        check(bool(errs), f"values with {typo} are rejected by values.schema.json")


def pkg_of(lib):
    for p in (lib, "/usr" + lib, os.path.realpath(lib), lib.replace("/usr/lib", "/lib", 1)):
        r = subprocess.run(["dpkg", "-S", p], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":")[0].strip()
    return None


def installed_deps(pkgs):
    """Transitive Depends/Pre-Depends of installed packages (what apt pulls in)."""
    seen, todo = set(), list(pkgs)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        r = subprocess.run(["dpkg-query", "-W", "-f=${Depends}, ${Pre-Depends}", p], capture_output=True, text=True)
        for alt in r.stdout.split(","):
            name = alt.strip().split("|")[0].split(" ")[0].split(":")[0].strip()
            if name:
                todo.append(name)
    return seen


def check_runtime_packages():
    ldd = subprocess.run(["ldd", BINARY], capture_output=True, text=True, check=True).stdout
    libs = [m.group(1) for m in re.finditer(r"=> (/\S+)", ldd)]
    setup = open(os.path.join(SRC, "scripts", "setup")).read()
    runtime = re.search(r"runtime_pkgs=\(([^)]*)\)", setup).group(1).split()
    docker = open(os.path.join(SRC, "Dockerfile")).read()
    check("scripts/setup --runtime" in docker or all(p in docker for p in runtime), "Dockerfile installs the runtime list")
    # Essential in debian:bookworm-slim (apt and dpkg need them).
    base = {"libc6", "libgcc-s1", "libstdc++6"}
    covered = installed_deps(runtime) | base
    for lib in libs:
        pkg = pkg_of(lib)
        check(pkg is not None and pkg in covered, f"runtime image has {lib} (package {pkg})")
        if pkg and pkg not in set(runtime) | base:
            print(f"note: {lib} ({pkg}) arrives as a dependency of the runtime list")


def check_dockerfile():
    text = open(os.path.join(SRC, "Dockerfile")).read()
    check(re.search(r"^FROM debian:bookworm\S* AS build", text, re.M | re.I) is not None, "Dockerfile: bookworm builder stage")
    check(re.search(r"^FROM debian:bookworm-slim", text, re.M) is not None, "Dockerfile: bookworm-slim runtime")
    check(re.search(r"^USER \d+", text, re.M) is not None, "Dockerfile: numeric non-root USER")
    check(re.search(r'^ENTRYPOINT \["/usr/local/bin/kdedup"', text, re.M) is not None, "Dockerfile: exec-form ENTRYPOINT")
    check(re.search(r"^VOLUME \[\"/var/lib/kdedup\"\]", text, re.M) is not None, "Dockerfile: state VOLUME")
    check("org.opencontainers.image" in text, "Dockerfile: OCI labels")
    check(re.search(r"ctest .*-L unit", text) is not None, "Dockerfile: builder runs the unit tests")
    check(re.search(r"^STOPSIGNAL SIGTERM", text, re.M) is not None, "Dockerfile: SIGTERM stop signal")
    check(os.path.exists(os.path.join(SRC, ".dockerignore")), ".dockerignore exists")


def main():
    os.makedirs(WORK, exist_ok=True)
    renderer = build_renderer()
    default_docs = render(renderer, [], "default")
    check_manifests(default_docs, "default", merged_values([]))
    prod_file = os.path.join(CHART, "ci", "production-values.yaml")
    prod_docs = render(renderer, [prod_file], "production")
    check_manifests(prod_docs, "production", merged_values([prod_file]))
    # The optional parts switched the other way: HPA on, no PVC, no dashboards.
    variant = os.path.join(WORK, "variant-values.yaml")
    with open(variant, "w") as f:
        f.write("autoscaling:\n  enabled: true\n  maxReplicas: 4\npersistence:\n  enabled: false\n"
                "metrics:\n  dashboards:\n    enabled: false\nstaticMembership:\n  enabled: false\n"
                "podDisruptionBudget:\n  enabled: false\nvalidateConfig: false\n")
    variant_docs = render(renderer, [variant], "variant")
    check_manifests(variant_docs, "variant", merged_values([variant]))
    hpa = [d for d in variant_docs if d["kind"] == "HorizontalPodAutoscaler"]
    check(len(hpa) == 1 and hpa[0]["spec"]["maxReplicas"] == 4 and hpa[0]["spec"]["scaleTargetRef"]["kind"] == "StatefulSet",
          "variant: HPA targets the StatefulSet")
    vsts = next(d for d in variant_docs if d["kind"] == "StatefulSet")
    check("replicas" not in vsts["spec"] and "volumeClaimTemplates" not in vsts["spec"]
          and any(v["name"] == "state" and "emptyDir" in v for v in vsts["spec"]["template"]["spec"]["volumes"]),
          "variant: HPA owns replicas, state on emptyDir")
    check(not any(d["kind"] == "PodDisruptionBudget" for d in variant_docs), "variant: PDB off")

    # A config change changes the checksum annotation (rolls the pods).
    changed = os.path.join(WORK, "changed-values.yaml")
    with open(changed, "w") as f:
        f.write("config:\n  window: 12h\n")
    changed_docs = render(renderer, [changed], "changed")
    sts = lambda docs: next(d for d in docs if d["kind"] == "StatefulSet")
    check(sts(changed_docs)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
          != sts(default_docs)["spec"]["template"]["metadata"]["annotations"]["checksum/config"],
          "config change changes checksum/config")
    # required: an empty bootstrap list fails the render with the reason.
    broken = os.path.join(WORK, "broken-values.yaml")
    with open(broken, "w") as f:
        f.write("kafka:\n  bootstrapServers: \"\"\n")
    res = subprocess.run([renderer, "-chart", CHART, "-f", broken], capture_output=True, text=True)
    check(res.returncode != 0 and "kafka.bootstrapServers is required" in res.stderr, "required bootstrapServers enforced")

    check_values_schema()
    check_dockerfile()
    check_runtime_packages()

    if shutil.which("helm"):
        for args in (["lint", CHART], ["template", "kdedup", CHART, "-f", prod_file]):
            res = subprocess.run(["helm"] + args, capture_output=True, text=True)
            check(res.returncode == 0, f"helm {args[0]}: {res.stderr.strip()}")
    else:
        print("helm not installed: skipped helm lint and helm template (rendered with render/main.go instead)")

    print(f"{passed} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
