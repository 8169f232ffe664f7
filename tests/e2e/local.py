"""A real single-node Kubernetes on this machine, with gpushare's parts as host processes.

Unmodified upstream binaries (a directory of them, or the release tarball that
`../shared/k8s/` holds) are started by the runtime scripts of
`../shared/realcluster/` (etcd, kube-apiserver, kube-scheduler with
`config/kube-scheduler-config.yaml`, kube-controller-manager, containerd, a
kubelet in its own mount namespace). Then gpushare is set up as the chart would:
its ServiceAccounts, RBAC and (from 1.30) the device plugin's admission policy applied
to the API server, every other object of the chart checked by the server
(`--dry-run=server`), its webhook configurations pointed at the extender on loopback
with a certificate made here, and `gpushare-extender`, `gpushare-device-plugin
--backend mock` (inside the kubelet's namespace) and `gpushare-isolation` started with
tokens of the chart's ServiceAccounts, so the chart's RBAC is what they run with. The
plugin's token is bound to a stand-in for its DaemonSet pod on the node, as the
kubelet's token for that pod is, so it names the node the policy keeps it to.

Environment: GPUSHARE_E2E_K8S_BIN (the binaries, one directory per version separated
by ':'; `scripts/test` sets it from ../shared/k8s and its version directories when
present), GPUSHARE_E2E_REALCLUSTER (the scripts, default ../shared/realcluster),
GPUSHARE_E2E_STATE_ROOT (where the state directory gpushare-e2e-<version> goes,
default /tmp), GPUSHARE_E2E_KEEP=1 (leave the cluster running).
"""

import base64
import copy
import datetime
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.e2e.kube import ROOT, KubectlTarget, run, wait_for
from tests.e2e.workloads import BUSYBOX

NODE: Final = "k8s-real-node"
MOCK_GPUS: Final = "2x16GiB,1x24GiB"
GPU_SIZES: Final = (16, 16, 24)
SYSTEM_NAMESPACE: Final = "gpushare-system"
EXTENDER_PORT: Final = 39999
EXTENDER_OPS_PORT: Final = 39996
"""Health, metrics and /inspect; the verbs' port serves kube-scheduler alone."""
WEBHOOK_PORT: Final = 9443
PLUGIN_METRICS_PORT: Final = 39991
AGENT_METRICS_PORT: Final = 39992
"""The node components' /metrics (the chart's 9401 and 9402 may be taken on a host)."""
CHART_VALUES: Final = {"gpu": {"backend": "mock", "mockGpus": MOCK_GPUS}}
"""What an operator trying gpushare without GPUs installs; everything else default."""
SCHEDULER_CONFIG: Final = ROOT / "config" / "kube-scheduler-config.yaml"
BINARIES: Final = ("kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubelet")
TARBALL: Final = "kubernetes-server-bin.tar.xz"
RBAC_KINDS: Final = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
POLICY_KINDS: Final = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
NODE_POD: Final = "gpushare-node-stand-in"
"""In SYSTEM_NAMESPACE, bound to NODE, running as the device plugin's account: the
DaemonSet's pod whose token the plugin uses (the DaemonSet itself is only dry-run)."""
WEBHOOK_KINDS: Final = {"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"}
_CRI_LINE = re.compile(r"^\S+ (?:stdout|stderr) [FP] ?(.*)$")


_running: "LocalCluster | None" = None
"""The cluster up on this machine now, if any."""


def scripts_dir() -> Path:
    default = ROOT.parent / "shared" / "realcluster"
    return Path(os.environ.get("GPUSHARE_E2E_REALCLUSTER", str(default)))


def sources() -> list[Path]:
    """The Kubernetes versions to run the tier on: GPUSHARE_E2E_K8S_BIN, one directory or
    several separated by ':' (each holding the binaries or the release tarball)."""
    value = os.environ.get("GPUSHARE_E2E_K8S_BIN", "")
    return [Path(part) for part in value.split(os.pathsep) if part]


def missing_prerequisites(source: Path | None) -> str | None:
    """Why the local real-cluster tier cannot run here, or None when it can."""
    if source is None:
        return (
            "the real-cluster tier needs GPUSHARE_E2E_K8S_BIN: a directory holding the upstream "
            f"{', '.join(BINARIES)} binaries or {TARBALL}, or several separated by ':' "
            "(scripts/test sets it from ../shared/k8s when that exists)"
        )
    if not (source / "kube-apiserver").is_file() and not (source / TARBALL).is_file():
        return f"GPUSHARE_E2E_K8S_BIN: {source} holds neither kube-apiserver nor {TARBALL}"
    if not (scripts_dir() / "up.sh").is_file():
        return f"no real-cluster scripts at {scripts_dir()} (set GPUSHARE_E2E_REALCLUSTER)"
    if os.geteuid() != 0:
        return "the real-cluster tier runs containerd and a kubelet: it needs root"
    if shutil.which("kubectl") is None:
        return "the real-cluster tier needs kubectl on PATH"
    return None


@dataclass(frozen=True)
class Binaries:
    directory: Path
    version: str
    """e.g. v1.28.7"""

    @property
    def minor(self) -> int:
        return int(self.version.split(".")[1])


def binaries(source: Path, state_root: Path) -> Binaries:
    """The binaries in `source`, or unpacked from its tarball into a directory of their
    own beside the state (once per version; never into the source)."""
    if (source / "kube-apiserver").is_file():
        directory = source
    else:
        version = (source / "VERSION").read_text().split()[0]
        directory = state_root / f"bin-{version}"
        if not all((directory / b).is_file() for b in BINARIES):
            directory.mkdir(parents=True, exist_ok=True)
            with tarfile.open(source / TARBALL) as archive:
                archive.extractall(directory, filter="data")
    out = run([str(directory / "kube-apiserver"), "--version"]).stdout
    return Binaries(directory, out.split()[-1])


@dataclass
class HostProcess:
    """One of our components, started on this machine with its log in a file."""

    name: str
    args: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> "HostProcess":
        assert not self.alive, f"{self.name} is already running"
        with self.log.open("ab") as out:
            out.write(f"=== start {datetime.datetime.now().isoformat()}\n".encode())
            out.flush()
            self.process = subprocess.Popen(
                self.args,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,
            )
        return self

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def since_start(self) -> str:
        """What the current run of the process logged (the log file keeps earlier runs)."""
        return self.text().rsplit("=== start ", 1)[-1]

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.text().splitlines()[-lines:])


def _self_signed_webhook_certificate(directory: Path) -> tuple[Path, Path, bytes]:
    """A CA and a serving certificate for 127.0.0.1, as the chart's genSignedCert makes
    for the Service name. Returns (cert file, key file, CA certificate PEM)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpushare-e2e-webhook-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_file, key_file = directory / "webhook.crt", directory / "webhook.key"
    cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_file.chmod(0o600)
    return cert_file, key_file, ca.public_bytes(serialization.Encoding.PEM)


def webhooks_on_loopback(
    objects: list[dict[str, Any]], ca_pem: bytes, port: int = WEBHOOK_PORT
) -> list[dict[str, Any]]:
    """The chart's webhook configurations, unchanged but for where the API server calls
    them: the extender on loopback instead of its Service (there is no pod network)."""
    hooks = []
    for obj in objects:
        if obj["kind"] not in WEBHOOK_KINDS:
            continue
        obj = copy.deepcopy(obj)
        for hook in obj["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca_pem).decode(),
            }
        hooks.append(obj)
    return hooks


@dataclass
class LocalCluster(KubectlTarget):
    """The cluster, our processes on it, and the knobs the scenarios turn."""

    state: Path = Path("/tmp/gpushare-e2e")
    bins: Binaries | None = None
    scripts: Path = field(default_factory=scripts_dir)
    extender: HostProcess | None = None
    plugin: HostProcess | None = None
    agent: HostProcess | None = None
    scheduler: HostProcess | None = None
    """Set once a test replaced the kube-scheduler that up.sh started."""
    rendered: list[dict[str, Any]] = field(default_factory=list)
    ca_pem: bytes = b""
    timings: dict[str, float] = field(default_factory=dict)
    pod_network: str = ""
    """"" (no pod network: our parts as host processes) or "bridge" (real pod
    addresses, Services' endpoints, ServiceAccount tokens: the chart's pods run)."""
    is_up: bool = False
    scheduler_config: Path = SCHEDULER_CONFIG
    """The KubeSchedulerConfiguration kube-scheduler starts with."""

    @property
    def version(self) -> str:
        assert self.bins is not None
        return self.bins.version

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def our_dir(self) -> Path:
        return self.state / "gpushare"

    @property
    def health_file(self) -> Path:
        """Indices of the mock GPUs the plugin reports Unhealthy, one per line."""
        return self.our_dir / "unhealthy-gpus"

    @property
    def control_dir(self) -> Path:
        return self.our_dir / "cgpu"

    @property
    def venv_bin(self) -> Path:
        return Path(sys.executable).parent

    def script(self, name: str, *args: str, timeout: float = 600, **env: str) -> str:
        assert self.bins is not None
        result = run(
            [str(self.scripts / name), *args],
            env={
                **os.environ,
                "K": str(self.state),
                "BIN": str(self.bins.directory),
                "KUBECONFIG": str(self.kubeconfig),
                **({"POD_NETWORK": self.pod_network} if self.pod_network else {}),
                **env,
            },
            timeout=timeout,
        )
        return result.stdout

    # ----- the cluster

    def up(self) -> None:
        global _running
        if _running is not None and _running is not self:
            # One cluster per machine (fixed ports): the tier's two kinds take turns.
            _running.down()
        _running = self
        started = time.monotonic()
        self.state.mkdir(parents=True, exist_ok=True)
        self.is_up = True
        self.start_cluster()
        self.timings["cluster up"] = time.monotonic() - started
        started = time.monotonic()
        self.install_gpushare()
        self.timings["gpushare up"] = time.monotonic() - started

    def start_cluster(self) -> None:
        self.script("prepare.sh")
        self.script("up.sh", SCHED_CONFIG=str(self.scheduler_config), NO_FAKE_DP="1", WITH_KCM="1")

    def down(self) -> None:
        global _running
        if not self.is_up:
            return
        for process in (self.agent, self.plugin, self.extender, self.scheduler):
            if process is not None:
                process.stop()
        self.script("down.sh", timeout=180)
        self.is_up = False
        if _running is self:
            _running = None

    def restart_kubelet(self) -> None:
        self.script("restart-kubelet.sh", timeout=180)

    def scheduler_alive(self) -> bool:
        if self.scheduler is not None:
            return self.scheduler.alive
        return self._recorded_alive("scheduler")

    def kill_scheduler(self) -> None:
        """SIGKILL, as a crashed node would: the Lease is not released."""
        if self.scheduler is not None:
            self.scheduler.stop(signal.SIGKILL)
        elif self._recorded_alive("scheduler"):
            os.kill(int((self.state / "scheduler.pid").read_text()), signal.SIGKILL)

    def start_scheduler(self) -> None:
        """kube-scheduler again, as up.sh starts it (its log appended to the same file)."""
        assert self.bins is not None
        self.scheduler = HostProcess(
            "kube-scheduler",
            [str(self.scripts / "start-scheduler.sh")],
            self.logs / "scheduler.log",
            env={"K": str(self.state), "BIN": str(self.bins.directory)},
        ).start()

    def scheduler_log(self) -> str:
        """The log of the kube-scheduler that start_scheduler started last."""
        assert self.scheduler is not None, "the harness's own kube-scheduler was not restarted"
        return self.scheduler.since_start()

    def _recorded_alive(self, name: str) -> bool:
        """Whether the process up.sh recorded in NAME.pid still runs (PID and start time)."""
        try:
            pid = int((self.state / f"{name}.pid").read_text())
            recorded = (self.state / f"{name}.pid.start").read_text().strip()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (OSError, ValueError):
            return False
        fields = stat.rsplit(") ", 1)[1].split()
        # A killed process whose parent has not reaped it yet is a zombie: dead.
        return fields[0] != "Z" and fields[19] == recorded

    def namespace_holder(self) -> str:
        return (self.state / "ns-holder.pid").read_text().strip()

    def container_log(self, pod: dict[str, Any], container: str) -> str:
        """Read from the kubelet's log directory: the node has no address, so
        `kubectl logs` cannot reach it (see realcluster's README)."""
        meta = pod["metadata"]
        directory = (
            self.state / "ns" / "var-log" / "pods"
            / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / container
        )  # fmt: skip
        runs = sorted(directory.glob("*.log"), key=lambda p: int(p.stem))
        if not runs:
            return ""
        lines = []
        for line in runs[-1].read_text(errors="replace").splitlines():
            match = _CRI_LINE.match(line)
            lines.append(match.group(1) if match else line)
        return "\n".join(lines)

    # ----- gpushare on it, set up as the chart would

    def install_gpushare(self) -> None:
        from tests.chart.rendering import render

        self.our_dir.mkdir(parents=True, exist_ok=True)
        self.kubectl("create", "namespace", SYSTEM_NAMESPACE)
        self.rendered = render(
            CHART_VALUES, namespace=SYSTEM_NAMESPACE, kube_version=self.version
        ).objects
        self.apply([o for o in self.rendered if o["kind"] in RBAC_KINDS | POLICY_KINDS])
        cert, key, self.ca_pem = _self_signed_webhook_certificate(self.our_dir)
        self.apply(webhooks_on_loopback(self.rendered, self.ca_pem))
        self.kubectl("label", "node", NODE, "ack.node.gpu.schedule=core_mem", "--overwrite")
        self.health_file.write_text("")
        scheduler_kubeconfig = self.service_account_kubeconfig("scheduler")
        node_kubeconfig = self.service_account_kubeconfig("node", self.node_pod())
        self.extender = HostProcess(
            "extender",
            [
                str(self.venv_bin / "gpushare-extender"),
                "--host", "127.0.0.1", "--port", str(EXTENDER_PORT),
                "--ops-port", str(EXTENDER_OPS_PORT), "--webhook-port", str(WEBHOOK_PORT),
                "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                "--kubeconfig", str(scheduler_kubeconfig),
            ],
            self.logs / "gpushare-extender.log",
        )  # fmt: skip
        self.plugin = HostProcess(
            "device plugin",
            [
                "nsenter", "-t", self.namespace_holder(), "-m", "--",
                str(self.venv_bin / "gpushare-device-plugin"),
                "--node-name", NODE, "--backend", "mock", "--mock-gpus", MOCK_GPUS,
                "--mock-health-file", str(self.health_file),
                "--kubeconfig", str(node_kubeconfig),
                "--metrics-port", str(PLUGIN_METRICS_PORT),
            ],
            self.logs / "gpushare-device-plugin.log",
        )  # fmt: skip
        self.agent = HostProcess(
            "isolation agent",
            [
                str(self.venv_bin / "gpushare-isolation"),
                "--node-name", NODE, "--backend", "mock", "--mock-gpus", MOCK_GPUS,
                "--control-dir", str(self.control_dir),
                "--metrics-port", str(AGENT_METRICS_PORT),
            ],
            self.logs / "gpushare-isolation.log",
        )  # fmt: skip
        self.start_extender()
        self.start_plugin()
        self.agent.start()

    def service_account(self, component: str) -> str:
        """The name of the chart's ServiceAccount for `component` (node, scheduler)."""
        [account] = [
            o["metadata"]["name"]
            for o in self.rendered
            if o["kind"] == "ServiceAccount"
            and o["metadata"]["labels"].get("app.kubernetes.io/component") == component
        ]
        return account

    def node_pod(self) -> str:
        """Creates NODE_POD: bound to NODE at creation, running as the plugin's account."""
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": NODE_POD, "namespace": SYSTEM_NAMESPACE},
            "spec": {
                "nodeName": NODE,
                "serviceAccountName": self.service_account("node"),
                "automountServiceAccountToken": False,
                "containers": [{"name": "sleep", "image": BUSYBOX, "imagePullPolicy":
                                "IfNotPresent", "command": ["sleep", "2147483647"]}],
                "terminationGracePeriodSeconds": 0,
            },
        }  # fmt: skip
        self.create([pod])
        return NODE_POD

    def service_account_kubeconfig(self, component: str, bound_to_pod: str = "") -> Path:
        """A kubeconfig holding a TokenRequest token of the chart's ServiceAccount for
        `component`: what the component's pod would mount. Bound to a pod of
        SYSTEM_NAMESPACE, the token names the pod's node (Kubernetes >= 1.30) and is
        valid while the pod exists, as the kubelet's token of that pod is."""
        account = self.service_account(component)
        binding = ["--bound-object-kind", "Pod", "--bound-object-name", bound_to_pod]
        token = self.kubectl(
            "create", "token", account, "-n", SYSTEM_NAMESPACE, "--duration", "24h",
            *(binding if bound_to_pod else []),
        ).stdout.strip()  # fmt: skip
        admin = yaml.safe_load(self.kubeconfig.read_text())
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": admin["clusters"],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [
                {"name": account, "context": {"cluster": admin["clusters"][0]["name"],
                                              "user": account}}
            ],
            "current-context": account,
        }  # fmt: skip
        path = self.our_dir / f"{component}.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    # ----- our processes

    def start_extender(self) -> None:
        assert self.extender is not None
        self.extender.start()
        wait_for(
            "the extender to be ready",
            lambda: self._ready() or self._dead(self.extender),
            timeout=60,
            every=0.2,
        )

    def start_plugin(self, expected_mem: int = sum(GPU_SIZES)) -> None:
        """Starts the plugin and waits until it registered gpu-mem with the kubelet (the
        node's allocatable may still show the previous process's devices), then until
        the node advertises `expected_mem` GiB."""
        assert self.plugin is not None
        self.plugin.start()
        wait_for(
            "the device plugin to register aliyun.com/gpu-mem",
            lambda: (
                " registered aliyun.com/gpu-mem " in self.plugin.since_start()
                or self._dead(self.plugin)
            ),
            timeout=60,
            every=0.2,
        )
        wait_for(
            "aliyun.com/gpu-mem in the node's allocatable",
            lambda: self.allocatable("aliyun.com/gpu-mem") == expected_mem,
            timeout=60,
            every=0.5,
        )

    def _dead(self, process: HostProcess | None) -> bool:
        assert process is not None
        if not process.alive:
            raise RuntimeError(f"{process.name} exited; log tail:\n{process.tail()}")
        return False

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{EXTENDER_OPS_PORT}/readyz", timeout=2):
                return True
        except OSError:
            return False

    def extender_view(self) -> dict[str, Any]:
        """The extender's /inspect: its state, as it answers the scheduler."""
        url = f"http://127.0.0.1:{EXTENDER_OPS_PORT}/inspect"
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.load(response)

    def allocatable(self, resource: str) -> int | None:
        node = self.get("node", NODE)
        value = node["status"].get("allocatable", {}).get(resource)
        return None if value is None else int(value)

    def dump(self, into: Path) -> Path:
        """The cluster's state and every log, for a failed run."""
        into.mkdir(parents=True, exist_ok=True)
        for name, args in {
            "pods.txt": ["get", "pods", "-A", "-o", "wide"],
            "pods.yaml": ["get", "pods", "-A", "-o", "yaml"],
            "nodes.yaml": ["get", "nodes", "-o", "yaml"],
            "events.txt": ["get", "events", "-A", "--sort-by=.lastTimestamp"],
        }.items():
            result = self.kubectl(*args, check=False)
            (into / name).write_text(result.stdout + result.stderr)
        if self.logs.is_dir():
            shutil.copytree(self.logs, into / "logs", dirs_exist_ok=True)
        return into
