"""The health verdict on a Kubernetes node: a node condition and a taint
(docs/schedulers.md), with the standard library only.

- Condition ``ModbridgeCoolingDegraded`` (``status`` "True" = the problem, as
  node-problem-detector's conditions): PATCH ``nodes/NAME/status`` with a strategic
  merge patch on ``status.conditions`` (merged by ``type``); ``lastHeartbeatTime`` now,
  ``lastTransitionTime`` kept while the status stays.
- Taint ``modbridge.io/cooling-degraded:NoSchedule``: GET the node, add or remove that
  one taint in ``spec.taints`` (every other taint kept as it is), PATCH with the
  node's ``resourceVersion`` so a concurrent edit is refused (409) rather than lost;
  on 409 GET again and redo, :data:`CONFLICT_RETRIES` times.

In a pod: the service account's token and CA from
``/var/run/secrets/kubernetes.io/serviceaccount`` and
``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT``. The RBAC it needs: ``nodes``
get and patch, ``nodes/status`` patch (packaging/kubernetes/).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from modbridge.errors import ModbridgeError

CONDITION = "ModbridgeCoolingDegraded"
TAINT_KEY = "modbridge.io/cooling-degraded"
TAINT_EFFECT = "NoSchedule"
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TIMEOUT_S = 10.0
CONFLICT_RETRIES = 5
MESSAGE_MAX = 1024


class KubeError(ModbridgeError):
    """The API server cannot be reached or refused; ``status`` its HTTP code (if any)."""

    exit_code = 1

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Client:
    """Requests to the API server as the pod's service account (or ``token_file``).

    ``api_server``: ``https://HOST:PORT`` (default from the in-cluster environment);
    plain ``http://`` only to a loopback address (a test's fake server, ``kubectl
    proxy``), so a token never crosses a network in the clear."""

    def __init__(self, api_server: str | None = None, token_file=None, ca_file=None,
                 timeout_s: float = TIMEOUT_S, environ=None):  # fmt: skip
        env = os.environ if environ is None else environ
        if api_server is None:
            host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
            if not host:
                raise KubeError("not in a Kubernetes pod (KUBERNETES_SERVICE_HOST unset): "
                                "give --api-server URL")  # fmt: skip
            host = f"[{host}]" if ":" in host else host
            api_server = f"https://{host}:{port or 443}"
        u = urllib.parse.urlsplit(api_server)
        if u.scheme not in ("https", "http") or not u.hostname:
            raise KubeError(f"--api-server {api_server!r}: https://HOST[:PORT]")
        if u.scheme == "http" and not _loopback(u.hostname):
            raise KubeError(f"--api-server {api_server}: plain http only to a loopback "
                            "address (the token would travel in the clear)")  # fmt: skip
        self.base = api_server.rstrip("/")
        self.token_file = Path(token_file) if token_file else SA_DIR / "token"
        self.timeout_s = timeout_s
        self._ctx = None
        if u.scheme == "https":
            ca = Path(ca_file) if ca_file else SA_DIR / "ca.crt"
            try:
                self._ctx = ssl.create_default_context(cafile=str(ca) if ca.exists() else None)
            except (ssl.SSLError, OSError) as e:
                raise KubeError(f"{ca}: cannot load the CA: {e}") from None

    def _token(self) -> str | None:
        # read every time: a projected service-account token is rotated under us
        try:
            return self.token_file.read_text(encoding="ascii").strip() or None
        except FileNotFoundError:
            return None
        except OSError as e:
            raise KubeError(f"{self.token_file}: {e}") from None

    def request(self, method: str, path: str, body=None, content_type="application/json"):
        url = self.base + path
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        token = self._token()
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=self._ctx) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            detail = ""
            try:
                detail = json.loads(e.read()).get("message", "")
            except (ValueError, OSError, AttributeError):
                pass
            raise KubeError(f"{method} {path}: HTTP {e.code} {e.reason}"
                            + (f": {detail}" if detail else ""), e.code) from None  # fmt: skip
        except (urllib.error.URLError, OSError, ssl.SSLError) as e:
            why = getattr(e, "reason", e)
            raise KubeError(f"{method} {path}: cannot reach the API server {self.base}: "
                            f"{why}") from None  # fmt: skip
        try:
            obj = json.loads(raw) if raw else {}
        except ValueError:
            raise KubeError(f"{method} {path}: the answer is not JSON") from None
        if not isinstance(obj, dict):
            raise KubeError(f"{method} {path}: the answer is not a JSON object")
        return obj


def _node_path(node: str, sub: str = "") -> str:
    return f"/api/v1/nodes/{urllib.parse.quote(node, safe='')}{sub}"


def find_condition(node_obj: dict) -> dict | None:
    for c in (node_obj.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == CONDITION:
            return c
    return None


def _ours(t) -> bool:
    return isinstance(t, dict) and t.get("key") == TAINT_KEY and t.get("effect") == TAINT_EFFECT


def set_condition(client: Client, node: str, degraded: bool, reason: str, message: str,
                  current: dict | None = None) -> dict:  # fmt: skip
    """PATCH the condition; ``current``: the node as last read (its condition's
    transition time is kept while the status stays). Returns the condition sent."""
    if current is None:
        current = client.request("GET", _node_path(node))
    old = find_condition(current)
    status = "True" if degraded else "False"
    now = now_rfc3339()
    cond = {
        "type": CONDITION,
        "status": status,
        "reason": reason,
        "message": message[:MESSAGE_MAX],
        "lastHeartbeatTime": now,
        "lastTransitionTime": old["lastTransitionTime"]
        if old and old.get("status") == status and old.get("lastTransitionTime")
        else now,
    }
    client.request("PATCH", _node_path(node, "/status"), {"status": {"conditions": [cond]}},
                   "application/strategic-merge-patch+json")  # fmt: skip
    return cond


def set_taint(client: Client, node: str, present: bool, node_obj: dict | None = None) -> str:
    """Add or remove our taint, keeping every other; ``added``, ``removed`` or
    ``unchanged``. A concurrent edit (409) is read again and redone."""
    for attempt in range(CONFLICT_RETRIES + 1):
        if node_obj is None or attempt:
            node_obj = client.request("GET", _node_path(node))
        spec = node_obj.get("spec") or {}
        taints = [t for t in spec.get("taints") or [] if isinstance(t, dict)]
        has = any(_ours(t) for t in taints)
        if has == present:
            return "unchanged"
        if present:
            new = taints + [{"key": TAINT_KEY, "effect": TAINT_EFFECT}]
        else:
            new = [t for t in taints if not _ours(t)]
        rv = (node_obj.get("metadata") or {}).get("resourceVersion")
        patch = {"metadata": {"resourceVersion": rv}, "spec": {"taints": new or None}}
        try:
            client.request("PATCH", _node_path(node), patch, "application/merge-patch+json")
        except KubeError as e:
            if e.status == 409 and attempt < CONFLICT_RETRIES:
                continue
            raise
        return "added" if present else "removed"
    raise KubeError(f"{node}: the taint kept conflicting")  # not reached


def apply(verdict, node: str, client: Client, taint: bool = True) -> dict:
    """The verdict onto ``node``: the condition always, the taint unless ``taint`` is
    off. Degraded: condition first, then the taint; recovered: the taint goes first."""
    current = client.request("GET", _node_path(node))
    degraded = not verdict.healthy
    message = f"modbridge: {verdict.summary(MESSAGE_MAX - 11)}"
    out = {"node": node, "condition": None, "taint": "off" if not taint else None}
    if degraded:
        out["condition"] = set_condition(client, node, True, verdict.reason, message, current)
        if taint:
            out["taint"] = set_taint(client, node, True)
    else:
        if taint:
            out["taint"] = set_taint(client, node, False, current)
        out["condition"] = set_condition(client, node, False, verdict.reason, message, current)
    return out
