"""`modbridge healthcheck --kubernetes` (ops/k8snode.py) against a fake Kubernetes API
server on 127.0.0.1 (http.server) holding one node: the ModbridgeCoolingDegraded
condition set and cleared (transition time kept while the status stays), the taint
added and removed with every other taint kept, a concurrent edit (409) retried
without losing it, --no-taint, and --watch living through API errors."""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_health import cli

from modbridge.ops import health, k8snode

NODE = "gpu-node-1"
TAINT = {"key": "modbridge.io/cooling-degraded", "effect": "NoSchedule"}
OTHERS = [
    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
    {"key": "modbridge.io/cooling-degraded", "effect": "NoExecute"},  # an admin's: not ours
]


class FakeApi:
    """One node; PATCH /status merges conditions by type (strategic merge), PATCH of
    the node is a JSON merge patch with a resourceVersion precondition (409)."""

    def __init__(self, token="s3cret"):
        self.token = token
        self.node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "resourceVersion": "100", "labels": {"a": "b"}},
            "spec": {"taints": copy.deepcopy(OTHERS)},
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
            },
        }
        self.requests: list[tuple[str, str, str | None, object]] = []
        self.fail_next = 0  # answer 500 to this many requests
        self.garbage_next = 0  # answer 200 with a JSON list (not a node) to this many
        self.conflicts = 0  # answer 409 to this many node PATCHes (after a concurrent edit)
        self.lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, obj):
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self, method):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                with api.lock:
                    api.requests.append((method, self.path, self.headers.get("Content-Type"), body))
                    code, obj = api.answer(method, self.path, self.headers, body)
                self._send(code, obj)

            def do_GET(self):
                self._handle("GET")

            def do_PATCH(self):
                self._handle("PATCH")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _bump(self):
        md = self.node["metadata"]
        md["resourceVersion"] = str(int(md["resourceVersion"]) + 1)

    @staticmethod
    def _status(code, reason, message):
        return code, {"kind": "Status", "status": "Failure", "reason": reason, "message": message,
                      "code": code}  # fmt: skip

    def answer(self, method, path, headers, body):
        if headers.get("Authorization") != f"Bearer {self.token}":
            return self._status(401, "Unauthorized", "Unauthorized")
        if self.fail_next:
            self.fail_next -= 1
            return self._status(500, "InternalError", "etcd is having a bad day")
        if self.garbage_next:
            self.garbage_next -= 1
            return 200, ["not", "a", "node"]
        base = f"/api/v1/nodes/{NODE}"
        if path not in (base, base + "/status"):
            return self._status(404, "NotFound", f'nodes "{path.rsplit("/", 1)[-1]}" not found')
        if method == "GET":
            return 200, copy.deepcopy(self.node)
        ctype = headers.get("Content-Type")
        if path.endswith("/status"):
            assert ctype == "application/strategic-merge-patch+json", ctype
            conds = self.node["status"]["conditions"]
            for c in body["status"]["conditions"]:
                conds[:] = [x for x in conds if x["type"] != c["type"]] + [c]
            self._bump()
            return 200, copy.deepcopy(self.node)
        assert ctype == "application/merge-patch+json", ctype
        if self.conflicts:  # someone else edits the node in between
            self.conflicts -= 1
            self.node["spec"]["taints"].append(
                {"key": f"other/{self.conflicts}", "effect": "NoSchedule"}
            )
            self._bump()
        rv = (body.get("metadata") or {}).get("resourceVersion")
        if rv is not None and rv != self.node["metadata"]["resourceVersion"]:
            return self._status(409, "Conflict", "the object has been modified; please apply "
                                "your changes to the latest version and try again")  # fmt: skip
        taints = body["spec"]["taints"]
        if taints is None:
            self.node["spec"].pop("taints", None)
        else:
            self.node["spec"]["taints"] = taints
        self._bump()
        return 200, copy.deepcopy(self.node)

    # views
    def taints(self):
        return self.node["spec"].get("taints") or []

    def condition(self):
        return k8snode.find_condition(self.node)

    def patches(self, sub=""):
        return [r for r in self.requests if r[0] == "PATCH" and r[1].endswith(NODE + sub)]


@pytest.fixture
def api(tmp_path):
    a = FakeApi()
    a.thread.start()
    a.token_file = tmp_path / "token"
    a.token_file.write_text(a.token + "\n")
    try:
        yield a
    finally:
        a.server.shutdown()
        a.server.server_close()


DOC_OK = {
    "modules": [{"module_id": "b9bddcc21aff921d00d1d986", "link_up": True, "last_frame_age_s": 0.2,
                 "state": "HOSTED", "gpu": {"uuid": "GPU-1"},
                 "policy": {"level": "NORMAL", "reasons": []}}],
    "gpus": [{"uuid": "GPU-1"}],
}  # fmt: skip


def _doc(level="NORMAL"):
    d = copy.deepcopy(DOC_OK)
    d["modules"][0]["policy"]["level"] = level
    return json.dumps(d)


def hc(api, doc, *args, timeout=60):
    return cli("healthcheck", "--kubernetes", "--node", NODE, "--api-server", api.url,
               "--token-file", str(api.token_file), "--input", "-", "--json", *args,
               input=doc, timeout=timeout)  # fmt: skip


def test_condition_and_taint_set_then_cleared_other_taints_kept(api):
    res = hc(api, _doc("CRITICAL"))
    assert res.returncode == 1, res.stdout + res.stderr
    c = api.condition()
    assert c["status"] == "True" and c["reason"] == "ModuleCritical", c
    assert c["message"].startswith("modbridge: module b9bddcc21aff..: CRITICAL")
    assert c["lastHeartbeatTime"].endswith("Z") and c["lastTransitionTime"]
    assert api.taints() == OTHERS + [TAINT]
    assert json.loads(res.stdout)["action"]["taint"] == "added"
    first_transition = c["lastTransitionTime"]
    assert any(x["type"] == "Ready" for x in api.node["status"]["conditions"])
    # still unhealthy: the transition time stays, the taint is not added twice
    res = hc(api, _doc("CRITICAL"))
    assert api.condition()["lastTransitionTime"] == first_transition
    assert api.taints() == OTHERS + [TAINT]
    assert json.loads(res.stdout)["action"]["taint"] == "unchanged"
    # recovered: the taint goes (only ours), the condition is False
    res = hc(api, _doc())
    assert res.returncode == 0, res.stdout + res.stderr
    assert api.taints() == OTHERS
    c = api.condition()
    assert c["status"] == "False" and c["reason"] == "CoolingOk"
    assert c["message"].startswith("modbridge: cooling ok")
    # every node PATCH carried the resourceVersion it was computed from
    assert all(p[3]["metadata"]["resourceVersion"] for p in api.patches())
    # the order: degraded sets the condition before the taint; recovery removes it first
    kinds = [("status" if r[1].endswith("/status") else "node") for r in api.requests
             if r[0] == "PATCH"]  # fmt: skip
    assert kinds == ["status", "node", "status", "node", "status"], kinds


def test_the_last_taint_removed_and_none_before(api):
    api.node["spec"].pop("taints")
    assert hc(api, _doc("CRITICAL")).returncode == 1
    assert api.taints() == [TAINT]
    assert hc(api, _doc()).returncode == 0
    assert api.taints() == []


def test_a_concurrent_edit_is_retried_and_kept(api):
    api.conflicts = 2
    res = hc(api, _doc("CRITICAL"))
    assert res.returncode == 1 and json.loads(res.stdout)["action"]["taint"] == "added", res.stdout
    keys = [t["key"] for t in api.taints()]
    assert keys == [t["key"] for t in OTHERS] + ["other/1", "other/0", TAINT["key"]], keys
    assert len(api.patches()) == 3  # two 409s, then it went through
    api.conflicts = k8snode.CONFLICT_RETRIES + 1  # always someone faster: give up, say so
    res = hc(api, _doc())
    assert res.returncode == 1 and "HTTP 409" in res.stderr, res.stderr
    assert TAINT in api.taints()


def test_no_taint_sets_the_condition_only(api):
    res = hc(api, _doc("CRITICAL"), "--no-taint")
    assert res.returncode == 1 and api.condition()["status"] == "True"
    assert api.taints() == OTHERS and api.patches() == []


def test_api_errors_are_clear_and_exit_1(api, tmp_path):
    api.fail_next = 1
    res = hc(api, _doc())
    assert res.returncode == 1 and "HTTP 500" in res.stderr and "etcd is having" in res.stderr
    res = cli("healthcheck", "--kubernetes", "--node", "nosuch", "--api-server", api.url,
              "--token-file", str(api.token_file), "--input", "-", input=_doc())  # fmt: skip
    assert res.returncode == 1 and "HTTP 404" in res.stderr, res.stderr
    bad = tmp_path / "bad-token"
    bad.write_text("wrong")
    res = cli("healthcheck", "--kubernetes", "--node", NODE, "--api-server", api.url,
              "--token-file", str(bad), "--input", "-", input=_doc())  # fmt: skip
    assert res.returncode == 1 and "HTTP 401" in res.stderr
    res = cli("healthcheck", "--kubernetes", "--node", NODE, "--api-server",
              "http://127.0.0.1:1", "--input", "-", input=_doc())  # fmt: skip
    assert res.returncode == 1 and "cannot reach the API server" in res.stderr
    res = cli("healthcheck", "--kubernetes", "--node", NODE, "--api-server",
              "http://10.1.2.3:6443", "--input", "-", input=_doc())  # fmt: skip
    assert res.returncode == 1 and "plain http only to a loopback" in res.stderr


def test_watch_lives_through_api_errors_and_updates_on_change_only(api, tmp_path):
    doc = tmp_path / "status.json"
    doc.write_text(_doc("CRITICAL"))
    api.fail_next = 2  # the first two checks' GETs fail: logged, backed off, not fatal
    res = cli("healthcheck", "--kubernetes", "--node", NODE, "--api-server", api.url,
              "--token-file", str(api.token_file), "--input", str(doc), "--watch", "1",
              "--count", "5", "--start-grace", "0", timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stderr.count("HTTP 500") == 2 and "again in 2 s" in res.stderr, res.stderr
    assert api.condition()["status"] == "True" and TAINT in api.taints()
    # told once (the verdict did not change, the heartbeat is 300 s)
    assert len(api.patches("/status")) == 1 and len(api.patches()) == 1
    assert res.stdout.count("unhealthy: ") == 1, res.stdout
    # a heartbeat of 1 s: the condition is sent again, the taint is not re-added
    res = cli("healthcheck", "--kubernetes", "--node", NODE, "--api-server", api.url,
              "--token-file", str(api.token_file), "--input", str(doc), "--watch", "1",
              "--count", "3", "--heartbeat", "1", "--start-grace", "0", timeout=60)  # fmt: skip
    assert res.returncode == 0 and len(api.patches("/status")) >= 3
    assert api.taints().count(TAINT) == 1
    # an answer that is not a node: logged, retried, the watch goes on
    api.garbage_next = 1
    doc.write_text(_doc())
    res = cli("healthcheck", "--kubernetes", "--node", NODE, "--api-server", api.url,
              "--token-file", str(api.token_file), "--input", str(doc), "--watch", "1",
              "--count", "2", "--start-grace", "0", timeout=60)  # fmt: skip
    assert res.returncode == 0 and "the answer is not a JSON object" in res.stderr, res.stderr
    assert api.condition()["status"] == "False" and TAINT not in api.taints()
    # garbage in the file: logged, never acted on, the watch goes on
    doc.write_text("{not json")
    n = len(api.requests)
    res = cli("healthcheck", "--kubernetes", "--node", NODE, "--api-server", api.url,
              "--token-file", str(api.token_file), "--input", str(doc), "--watch", "1",
              "--count", "2", timeout=60)  # fmt: skip
    assert res.returncode == 0 and res.stderr.count("not JSON") == 2 and len(api.requests) == n


def test_watch_start_grace_waits_for_the_bridge(api, tmp_path):
    res = cli("healthcheck", "--kubernetes", "--node", NODE, "--api-server", api.url,
              "--token-file", str(api.token_file), "--control-socket",
              str(tmp_path / "none.sock"), "--watch", "1", "--count", "2", timeout=60)  # fmt: skip
    assert res.returncode == 0 and "waiting for the bridge" in res.stderr, res.stderr
    assert api.requests == []
    res = cli("healthcheck", "--kubernetes", "--node", NODE, "--api-server", api.url,
              "--token-file", str(api.token_file), "--control-socket",
              str(tmp_path / "none.sock"), "--watch", "1", "--count", "1",
              "--start-grace", "0", timeout=60)  # fmt: skip
    assert api.condition()["reason"] == "NoBridge" and TAINT in api.taints()


def test_in_cluster_defaults(tmp_path):
    c = k8snode.Client(environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1",
                                "KUBERNETES_SERVICE_PORT": "443"})  # fmt: skip
    assert c.base == "https://10.96.0.1:443" and c.token_file == k8snode.SA_DIR / "token"
    c = k8snode.Client(
        environ={"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    )
    assert c.base == "https://[fd00::1]:6443"
    with pytest.raises(k8snode.KubeError, match="not in a Kubernetes pod"):
        k8snode.Client(environ={})


def test_reasons_are_camel_case_and_stable():
    for code, reason in health.PROBLEMS.items():
        assert reason[0].isupper() and reason.isalnum(), (code, reason)
    assert health.HEALTHY_REASON == "CoolingOk"
