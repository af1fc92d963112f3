"""deploy/k8s and deploy/docker: every manifest is valid against the Kubernetes OpenAPI
schemas (kubernetes-validate's bundled JSON schemas, offline, strict: unknown fields are
errors), and consistent with evenserve itself: the worker's flags are real flags, its probes
are its health paths, the admin token comes from a Secret and never from the command line,
selectors select, Services reach container ports, pods carry Prometheus scrape annotations,
the gateway's cluster file loads with the gateway's own loader and lists exactly the worker
pods, the dashboard ConfigMap is the dashboard, and the Dockerfile copies what exists.
Each check is also run on a deliberately broken copy, which it must reject."""

from __future__ import annotations

import copy
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from evenserve.cli.main import app
from evenserve.cluster.admin_token import DEFAULT_TOKEN_ENV
from evenserve.cluster.file import load_cluster
from evenserve.core import wire

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
#: The kustomizations (each one a deployable set): the base, and the base plus MIG workers.
KUSTOMIZATIONS = [K8S / "base", K8S / "mig"]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
DASHBOARD = ROOT / "deploy" / "grafana" / "evenserve-dashboard.json"
#: The oldest Kubernetes the manifests are checked against, and the newest bundled.
K8S_VERSIONS = ["1.30.0", "1.37.0"]
HEALTH_PATHS = {wire.HEALTH_LIVE_PATH, wire.HEALTH_READY_PATH}
GPU_RESOURCE = re.compile(r"^nvidia\.com/(gpu|mig-\d+g\.\d+gb)$")
NON_ROOT_UID = 10001

Doc = dict[str, Any]


# -- reading a kustomization (what `kubectl kustomize` does, for the parts these files use) --


def load_kustomization(folder: Path) -> Doc:
    doc = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def resource_files(folder: Path) -> list[Path]:
    """Every manifest file a kustomization includes, its bases' first."""
    out: list[Path] = []
    for entry in load_kustomization(folder).get("resources", []):
        p = (folder / entry).resolve()
        out += resource_files(p) if p.is_dir() else [p]
    return out


def generator_files(folder: Path) -> dict[str, dict[str, Path]]:
    """configMapGenerator: name -> {key: file} (an overlay's ``behavior: replace`` wins)."""
    out: dict[str, dict[str, Path]] = {}
    for entry in load_kustomization(folder).get("resources", []):
        p = (folder / entry).resolve()
        if p.is_dir():
            out.update(generator_files(p))
    for gen in load_kustomization(folder).get("configMapGenerator", []):
        files = {}
        for item in gen.get("files", []):
            key, _, rel = item.rpartition("=")
            files[key or Path(rel).name] = (folder / rel).resolve()
        out[gen["name"]] = files
    return out


def namespace_of(folder: Path) -> str:
    ns = load_kustomization(folder).get("namespace")
    assert isinstance(ns, str) and ns
    return ns


def build(folder: Path) -> list[Doc]:
    """The kustomization's objects: its manifests (namespaced) and generated ConfigMaps,
    which the workloads mount by their generator's name."""
    ns = namespace_of(folder)
    docs: list[Doc] = []
    for f in resource_files(folder):
        for d in yaml.safe_load_all(f.read_text()):
            if d is None:
                continue
            d = copy.deepcopy(d)
            if d["kind"] != "Namespace":
                d["metadata"]["namespace"] = ns
            docs.append(d)
    for name, files in generator_files(folder).items():
        data = {key: p.read_text() for key, p in files.items()}
        meta = {"name": name, "namespace": ns}
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    return docs


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def pod_templates(docs: list[Doc]) -> list[tuple[Doc, Doc]]:
    return [(d, d["spec"]["template"]) for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


# -- the structural rules -----------------------------------------------------------------


def worker_flags() -> set[str]:
    """Every flag ``evenserve worker`` accepts, from its command line definition."""
    command = typer.main.get_command(app).commands["worker"]  # type: ignore[attr-defined]
    return {opt for param in command.params for opt in param.opts}


def evenserve_argv(container: Doc) -> list[str]:
    """The evenserve command line a container runs: its args under the image's ENTRYPOINT
    evenserve, or the ``exec evenserve ...`` line of a ``sh -c`` script."""
    command, args = container.get("command"), container.get("args", [])
    if command is None:
        return [str(a) for a in args]
    assert command[:2] == ["/bin/sh", "-c"], command
    lines = [ln.strip() for ln in args[0].splitlines() if ln.strip().startswith("exec evenserve")]
    assert len(lines) == 1, "the script must exec evenserve once"
    return shlex.split(lines[0])[2:]


def _flags(argv: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, a in enumerate(argv):
        if a.startswith("--"):
            out[a] = argv[i + 1] if i + 1 < len(argv) else ""
    return out


def container_problems(container: Doc, annotations: dict[str, str]) -> list[str]:
    """What is wrong with one container of a pod template (empty: nothing)."""
    name = container.get("name", "?")
    bad: list[str] = []
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    res = container.get("resources", {})
    for kind in ("requests", "limits"):
        for r in ("cpu", "memory"):
            if r not in res.get(kind, {}):
                bad.append(f"{name}: no resources.{kind}.{r}")
    for key in ("readinessProbe", "livenessProbe"):
        probe = container.get(key)
        if probe is None:
            bad.append(f"{name}: no {key}")
            continue
        get = probe.get("httpGet", {})
        want = wire.HEALTH_READY_PATH if key == "readinessProbe" else wire.HEALTH_LIVE_PATH
        if get.get("path") != want:
            bad.append(f"{name}: {key} path {get.get('path')!r}, not {want}")
        if get.get("port") not in ports and get.get("port") not in ports.values():
            bad.append(f"{name}: {key} port {get.get('port')!r} is no container port")
    argv = evenserve_argv(container)
    text = " ".join([*map(str, container.get("command") or []), *argv]).lower()
    if "token" in text:
        bad.append(f"{name}: the command line mentions a token")
    env = {e["name"]: e for e in container.get("env", [])}
    for key, e in env.items():
        if "TOKEN" in key.upper() and "value" in e:
            bad.append(f"{name}: env {key} is a literal, not from a Secret")
    token = env.get(DEFAULT_TOKEN_ENV, {}).get("valueFrom", {}).get("secretKeyRef")
    if not token:
        bad.append(f"{name}: {DEFAULT_TOKEN_ENV} not from a Secret")
    if annotations.get("prometheus.io/scrape") != "true":
        bad.append(f"{name}: no prometheus.io/scrape annotation")
    if annotations.get("prometheus.io/path") != wire.METRICS_PATH:
        bad.append(f"{name}: prometheus.io/path is not {wire.METRICS_PATH}")
    if str(annotations.get("prometheus.io/port")) not in {str(p) for p in ports.values()}:
        bad.append(f"{name}: prometheus.io/port is no container port")
    if argv[:1] == ["worker"]:
        bad += worker_problems(name, argv, res, ports)
    elif argv[:1] == ["gateway"]:
        if "--config" not in argv:
            bad.append(f"{name}: the gateway has no --config")
    else:
        bad.append(f"{name}: runs neither evenserve worker nor gateway: {argv[:1]}")
    return bad


def worker_problems(name: str, argv: list[str], res: Doc, ports: dict[str, int]) -> list[str]:
    bad: list[str] = []
    known = worker_flags()
    flags = _flags(argv)
    bad += [f"{name}: evenserve worker has no flag {f}" for f in flags if f not in known]
    for required in ("--repo", "--device", "--name", "--host", "--port"):
        if required not in flags:
            bad.append(f"{name}: worker without {required}")
    if flags.get("--host") not in ("0.0.0.0", "::"):
        bad.append(f"{name}: the worker must listen on every address, not {flags.get('--host')}")
    if flags.get("--port", "").isdigit() and int(flags["--port"]) not in ports.values():
        bad.append(f"{name}: --port {flags['--port']} is not its containerPort")
    gpus = {k: v for k, v in res.get("limits", {}).items() if GPU_RESOURCE.match(k)}
    if list(gpus.values()) != [1]:
        bad.append(f"{name}: a worker needs exactly one GPU or MIG slice, limits: {gpus}")
    for k, v in gpus.items():
        if res.get("requests", {}).get(k, v) != v:
            bad.append(f"{name}: {k} requests differ from limits")
    return bad


def workload_problems(docs: list[Doc]) -> list[str]:
    """Selectors, Services, volumes and security across the objects of one kustomization."""
    bad: list[str] = []
    workloads = pod_templates(docs)
    config_maps = {d["metadata"]["name"] for d in of_kind(docs, "ConfigMap")}
    claims = {d["metadata"]["name"] for d in of_kind(docs, "PersistentVolumeClaim")}
    for w, tpl in workloads:
        wname = w["metadata"]["name"]
        labels = tpl["metadata"].get("labels", {})
        sel = w["spec"]["selector"]["matchLabels"]
        if not sel.items() <= labels.items():
            bad.append(f"{wname}: selector {sel} does not select its pods {labels}")
        spec = tpl["spec"]
        ctx = spec.get("securityContext", {})
        if not ctx.get("runAsNonRoot") or ctx.get("runAsUser") != NON_ROOT_UID:
            bad.append(f"{wname}: not run as the image's non-root user {NON_ROOT_UID}")
        for c in spec["containers"]:
            bad += [f"{wname}/{p}" for p in container_problems(c, tpl["metadata"]["annotations"])]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec["containers"]:
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    bad.append(f"{wname}: mount {m['name']} has no volume")
        for v in volumes.values():
            if "configMap" in v and v["configMap"]["name"] not in config_maps:
                bad.append(f"{wname}: no ConfigMap {v['configMap']['name']}")
            pvc = v.get("persistentVolumeClaim", {}).get("claimName")
            if pvc is not None and pvc not in claims:
                bad.append(f"{wname}: no PersistentVolumeClaim {pvc}")
        if w["kind"] == "StatefulSet":
            svc = [
                s
                for s in of_kind(docs, "Service")
                if s["metadata"]["name"] == w["spec"]["serviceName"]
            ]
            if not svc or svc[0]["spec"].get("clusterIP") != "None":
                bad.append(
                    f"{wname}: serviceName {w['spec']['serviceName']} is no headless Service"
                )
    for s in of_kind(docs, "Service"):
        sel = s["spec"].get("selector", {})
        hits = [tpl for _, tpl in workloads if sel.items() <= tpl["metadata"]["labels"].items()]
        if not sel or not hits:
            bad.append(f"Service {s['metadata']['name']}: its selector selects no pods")
        for port in s["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for tpl in hits:
                declared = {
                    v
                    for c in tpl["spec"]["containers"]
                    for p in c.get("ports", [])
                    for v in (p.get("name"), p["containerPort"])
                }
                if target not in declared:
                    bad.append(
                        f"Service {s['metadata']['name']}: targetPort {target} not on its pods"
                    )
    return bad


def expected_backends(docs: list[Doc]) -> dict[str, str]:
    """Every worker pod's name -> its URL through the headless Service's DNS."""
    out = {}
    for w in of_kind(docs, "StatefulSet"):
        ns, svc, name = w["metadata"]["namespace"], w["spec"]["serviceName"], w["metadata"]["name"]
        port = w["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
        for i in range(w["spec"]["replicas"]):
            out[f"{name}-{i}"] = f"http://{name}-{i}.{svc}.{ns}.svc.cluster.local:{port}"
    return out


def cluster_file_problems(docs: list[Doc], cluster_yaml: Path) -> list[str]:
    """The gateway's cluster file: it loads, and it routes to exactly the worker pods."""
    bad: list[str] = []
    cluster = load_cluster(cluster_yaml)
    got = {b.name: b.url for b in cluster.backends()}
    if got != expected_backends(docs):
        bad.append(f"backends {got} are not the worker pods {expected_backends(docs)}")
    gw = cluster.config.gateway
    if gw.host not in ("0.0.0.0", "::"):
        bad.append(f"gateway.host {gw.host}: not reachable from other pods")
    if gw.admin.token is not None or gw.admin.token_env != DEFAULT_TOKEN_ENV:
        bad.append("gateway.admin: the token must come from the Secret's variable")
    (deploy,) = [d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == "gateway"]
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    if gw.port not in {p["containerPort"] for p in c["ports"]}:
        bad.append(f"gateway.port {gw.port} is not the gateway's containerPort")
    if gw.placement is not None and deploy["spec"]["replicas"] > 1:
        bad.append("gateway.placement with more than one gateway replica")
    return bad


# -- the tests ----------------------------------------------------------------------------


@pytest.fixture(scope="module", params=KUSTOMIZATIONS, ids=lambda p: p.name)
def kustomization(request: pytest.FixtureRequest) -> Path:
    path: Path = request.param
    return path


def test_every_file_belongs_to_a_kustomization() -> None:
    used = {k / "kustomization.yaml" for k in KUSTOMIZATIONS}
    for k in KUSTOMIZATIONS:
        used |= set(resource_files(k))
        used |= {p for files in generator_files(k).values() for p in files.values()}
    on_disk = {p.resolve() for p in K8S.rglob("*.yaml")}
    assert on_disk - used == set(), "manifests no kustomization includes"
    assert used - on_disk == set(), "files a kustomization names that do not exist"


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_match_the_kubernetes_schemas(kustomization: Path, version: str) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    errors = []
    for doc in build(kustomization):
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as exc:  # the message, not the whole schema
            where = "/".join(str(p) for p in exc.path)
            errors.append(f"{doc['kind']} {doc['metadata']['name']}: {where}: {exc.message}")
    assert errors == []


def test_the_schema_check_rejects_broken_manifests() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    docs = build(K8S / "base")
    (sts,) = of_kind(docs, "StatefulSet")
    typo = copy.deepcopy(sts)
    typo["spec"]["template"]["spec"]["contianers"] = typo["spec"]["template"]["spec"].pop(
        "containers"
    )
    wrong_type = copy.deepcopy(sts)
    wrong_type["spec"]["replicas"] = "two"
    no_selector = copy.deepcopy(sts)
    del no_selector["spec"]["selector"]
    for broken in (typo, wrong_type, no_selector):
        with pytest.raises(kv.ValidationError):
            kv.validate(broken, K8S_VERSIONS[-1], strict=True)


def test_workloads_are_consistent(kustomization: Path) -> None:
    docs = build(kustomization)
    assert {w["metadata"]["name"] for w, _ in pod_templates(docs)} >= {"gateway", "worker"}
    assert workload_problems(docs) == []


def test_the_gateway_runs_two_replicas_behind_a_service() -> None:
    docs = build(K8S / "base")
    (gw,) = [d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == "gateway"]
    assert gw["spec"]["replicas"] == 2
    assert "gateway" in {s["metadata"]["name"] for s in of_kind(docs, "Service")}
    (pdb,) = of_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == gw["spec"]["selector"]["matchLabels"]


def test_the_mig_overlay_asks_for_mig_slices() -> None:
    docs = build(K8S / "mig")
    (mig,) = [d for d in of_kind(docs, "StatefulSet") if d["metadata"]["name"] == "worker-mig"]
    (c,) = mig["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/mig-3g.20gb"] == 1
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    argv = evenserve_argv(c)
    assert _flags(argv)["--device"] == "$device"
    # The script picks the slice by its UUID; the worker's own parser accepts what it builds.
    from evenserve.runtime.device import parse_device

    uuid = "MIG-4a2c1e2b-7c1d-5e0f-9a3b-2d4c6e8f0a1b"
    assert parse_device(f"cuda:{uuid}").mig_uuid == uuid
    script = c["args"][0].replace("exec evenserve worker", 'echo "$device" #')
    for env, want in ((uuid, f"cuda:{uuid}"), ("0", "cuda:0"), ("", "cuda:0")):
        out = subprocess.run(
            ["/bin/sh", "-c", script],
            env={"NVIDIA_VISIBLE_DEVICES": env},
            capture_output=True,
            text=True,
        )
        assert out.stdout.strip() == want


def test_the_structural_checks_reject_broken_manifests() -> None:
    docs = build(K8S / "base")

    def broken(edit: Any) -> list[str]:
        d = copy.deepcopy(docs)
        edit(d)
        return workload_problems(d)

    def worker(d: list[Doc]) -> Doc:
        (sts,) = of_kind(d, "StatefulSet")
        container: Doc = sts["spec"]["template"]["spec"]["containers"][0]
        return container

    def token_on_command_line(d: list[Doc]) -> None:
        worker(d)["args"] += ["--admin-token-file", "/secret/token"]

    def literal_token(d: list[Doc]) -> None:
        (env,) = [e for e in worker(d)["env"] if e["name"] == DEFAULT_TOKEN_ENV]
        env.pop("valueFrom")
        env["value"] = "x" * 32

    def no_probe(d: list[Doc]) -> None:
        del worker(d)["readinessProbe"]

    def wrong_probe_path(d: list[Doc]) -> None:
        worker(d)["livenessProbe"]["httpGet"]["path"] = "/healthz"

    def unknown_flag(d: list[Doc]) -> None:
        worker(d)["args"] += ["--gpu", "0"]

    def no_gpu(d: list[Doc]) -> None:
        del worker(d)["resources"]["limits"]["nvidia.com/gpu"]

    def no_memory_limit(d: list[Doc]) -> None:
        del worker(d)["resources"]["limits"]["memory"]

    def selector_mismatch(d: list[Doc]) -> None:
        (svc,) = [s for s in of_kind(d, "Service") if s["metadata"]["name"] == "gateway"]
        svc["spec"]["selector"]["app.kubernetes.io/component"] = "gatewy"

    def wrong_target_port(d: list[Doc]) -> None:
        (svc,) = [s for s in of_kind(d, "Service") if s["metadata"]["name"] == "worker"]
        svc["spec"]["ports"][0]["targetPort"] = 9000

    def no_scrape(d: list[Doc]) -> None:
        (sts,) = of_kind(d, "StatefulSet")
        del sts["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"]

    def root(d: list[Doc]) -> None:
        (sts,) = of_kind(d, "StatefulSet")
        sts["spec"]["template"]["spec"]["securityContext"]["runAsUser"] = 0

    for edit in (
        token_on_command_line,
        literal_token,
        no_probe,
        wrong_probe_path,
        unknown_flag,
        no_gpu,
        no_memory_limit,
        selector_mismatch,
        wrong_target_port,
        no_scrape,
        root,
    ):
        assert broken(edit), f"{edit.__name__} was not caught"


def test_the_cluster_file_loads_and_lists_every_worker(kustomization: Path) -> None:
    docs = build(kustomization)
    (cluster_yaml,) = generator_files(kustomization)["evenserve-cluster"].values()
    assert cluster_file_problems(docs, cluster_yaml) == []
    assert all(namespace_of(kustomization) in url for url in expected_backends(docs).values())
    (gw,) = [d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == "gateway"]
    (c,) = gw["spec"]["template"]["spec"]["containers"]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "cluster"]
    assert _flags(evenserve_argv(c))["--config"] == f"{mount['mountPath']}/cluster.yaml"


def test_the_cluster_file_check_rejects_a_stale_list(tmp_path: Path) -> None:
    docs = build(K8S / "base")
    (cluster_yaml,) = generator_files(K8S / "base")["evenserve-cluster"].values()
    (sts,) = of_kind(docs, "StatefulSet")
    sts["spec"]["replicas"] += 1  # scaled up, the cluster file not edited
    assert cluster_file_problems(docs, cluster_yaml)
    local = tmp_path / "cluster.yaml"
    local.write_text(cluster_yaml.read_text().replace("host: 0.0.0.0", "host: 127.0.0.1"))
    assert cluster_file_problems(build(K8S / "base"), local)


def test_the_dashboard_configmap_is_the_dashboard() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import k8s_dashboard_configmap as gen
    finally:
        sys.path.pop(0)
    text = DASHBOARD.read_text()
    assert gen.CONFIGMAP.read_text() == gen.render(text), "run scripts/k8s_dashboard_configmap.py"
    cm = yaml.safe_load(gen.CONFIGMAP.read_text())
    assert cm["data"] == {DASHBOARD.name: text}
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert gen.render(text.replace("Queue", "Qeue", 1)) != gen.CONFIGMAP.read_text()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (its kustomize) not here")
def test_kustomize_builds_what_the_checks_read(kustomization: Path) -> None:
    """The checks read the kustomization as kustomize builds it: the same objects (a
    generated ConfigMap's name has a content hash appended), the same containers (the image
    gets its tag), in the kustomization's namespace."""
    out = subprocess.run(
        ["kubectl", "kustomize", str(kustomization)], capture_output=True, text=True, check=True
    ).stdout
    generated = set(generator_files(kustomization))
    ns = namespace_of(kustomization)

    def key(d: Doc) -> tuple[str, str]:
        name: str = d["metadata"]["name"]
        if d["kind"] == "ConfigMap" and name.rsplit("-", 1)[0] in generated:
            name = name.rsplit("-", 1)[0]
        return d["kind"], name

    def containers(d: Doc) -> list[Doc]:
        cs = d["spec"]["template"]["spec"]["containers"]
        return [{k: v for k, v in c.items() if k != "image"} for c in cs]

    built = {key(d): d for d in yaml.safe_load_all(out) if d}
    ours = {key(d): d for d in build(kustomization)}
    assert set(built) == set(ours)
    for k, d in built.items():
        assert d["metadata"].get("namespace", ns) == ns
        if k[0] in ("StatefulSet", "Deployment"):
            assert containers(d) == containers(ours[k])
        if k[0] == "ConfigMap":
            assert d["data"] == ours[k]["data"]


# -- the image ------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_the_dockerfile_copies_what_exists_and_runs_as_non_root() -> None:
    ops = dockerfile_instructions()
    ignore = [
        ln
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln and not ln.startswith("#")
    ]
    allowed = {ln[1:].rstrip("/") for ln in ignore if ln.startswith("!")}
    assert ignore[0] == "*", ".dockerignore: everything out, then the sources back in"
    copies = [rest.split() for op, rest in ops if op == "COPY" and "--from=" not in rest]
    assert copies
    for *sources, _dest in copies:
        for src in sources:
            assert (ROOT / src).exists(), f"COPY {src}: no such path"
            assert src.rstrip("/") in allowed, f"COPY {src}: .dockerignore leaves it out"
    # The wheel is built from exactly what was copied: pyproject names its readme and license.
    project = (ROOT / "pyproject.toml").read_text()
    for needed in ("README.md", "LICENSE", "src"):
        assert needed in allowed
        assert needed == "src" or needed in project
    assert sum(op == "FROM" for op, _ in ops) == 2, "multi-stage: the wheel, then the runtime"
    users = [rest for op, rest in ops if op == "USER"]
    assert users and users[-1].split(":")[0] == str(NON_ROOT_UID)
    assert ("ENTRYPOINT", '["evenserve"]') in ops
    exposed = {int(p) for op, rest in ops if op == "EXPOSE" for p in rest.split()}
    docs = build(K8S / "base")
    ports = {
        p["containerPort"]
        for _, t in pod_templates(docs)
        for c in t["spec"]["containers"]
        for p in c["ports"]
    }
    assert ports <= exposed
    assert any("--wheel" in rest for op, rest in ops if op == "RUN")
