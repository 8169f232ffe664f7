"""The real single-node cluster of tests/e2e/local.py in DRA mode (docs/dra.md).

The same harness (`../shared/realcluster`), brought up as DRA mode needs it:
DRAConsumableCapacity turned on in kube-apiserver and kube-scheduler where the release
has it off (1.34, 1.35: alpha), nothing turned on from 1.36 (beta, on); kube-scheduler
with the chart's scheduler configuration (its DRA plugin allocates the GPUs, the
extender's prioritize-claims entry scores the nodes; a default-scheduler profile beside);
kube-controller-manager for its resourceclaim controller (claims from the webhook's
templates); CDI turned on in the harness's containerd where it has the switch.

gpushare is set up as the chart renders it with `dra.enabled`: its ServiceAccounts,
RBAC, admission policies and DeviceClass applied to the API server, its webhooks
pointed at the extender on loopback, `gpushare-extender --dra-claims` with the
scheduler's account and `gpushare-dra-plugin --backend mock` inside the kubelet's
mount namespace (its /var/lib/kubelet, its /var/run/cdi, which containerd reads)
with a token of the driver's account bound to a stand-in for its DaemonSet pod, so
the chart's RBAC and own-node policy are what it runs with. No device plugin and no
isolation agent run: a node serves its GPUs one way.
"""

import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import yaml

from gpushare.dra.claims import DRIVER
from tests.e2e.kube import run, wait_for
from tests.e2e.local import (
    EXTENDER_OPS_PORT,
    EXTENDER_PORT,
    MOCK_GPUS,
    NODE,
    POLICY_KINDS,
    RBAC_KINDS,
    SYSTEM_NAMESPACE,
    WEBHOOK_PORT,
    Binaries,
    HostProcess,
    LocalCluster,
    _self_signed_webhook_certificate,
    webhooks_on_loopback,
)
from tests.e2e.workloads import BUSYBOX

FIRST_DRA_MINOR: Final = 34
"""resource.k8s.io/v1 (DRA GA) is served from Kubernetes 1.34 (DRA-INTERFACES §4)."""
GATE: Final = "DRAConsumableCapacity"
GATE_ON_BY_DEFAULT_FROM: Final = 36
"""Alpha and off in 1.34 and 1.35, beta and on from 1.36 (DRA-INTERFACES §5)."""
DRA_COMPONENT: Final = "dra-node"
"""The chart's app.kubernetes.io/component of the driver's ServiceAccount and DeviceClass."""
DRIVER_POD: Final = "gpushare-dra-node-stand-in"
"""In SYSTEM_NAMESPACE, bound to NODE, running as the driver's account: the DRA
DaemonSet's pod, whose token names the node the own-node policy keeps it to."""
KUBELET_ROOT: Final = "/var/lib/kubelet"
CDI_DIR: Final = "/var/run/cdi"
"""Inside the kubelet's namespace (/run there is a private tmpfs): where the driver
writes its CDI specs and containerd reads them (the chart's dra.cdiDir)."""
STATE_DIR: Final = "/var/lib/gpushare/dra"
"""Inside the namespace, i.e. under $K/ns/var-lib on the host: fresh at every up.sh."""
REGISTERED: Final = f"the kubelet registered DRA driver {DRIVER}"
"""What the driver logs when the kubelet confirms its registration
(NotifyRegistrationStatus(true), DRA-INTERFACES §1)."""
CHART_KINDS: Final = RBAC_KINDS | POLICY_KINDS | {"DeviceClass"}


def unsupported(bins: Binaries) -> str | None:
    """Why these binaries cannot run DRA mode, or None when they can."""
    if bins.minor < FIRST_DRA_MINOR:
        return (
            f"Kubernetes {bins.version} does not serve resource.k8s.io/v1 (DRA is GA from "
            f"1.{FIRST_DRA_MINOR}): the DRA scenarios need binaries of 1.{FIRST_DRA_MINOR} "
            "or later in GPUSHARE_E2E_K8S_BIN"
        )
    return None


def gate_args(minor: int) -> str:
    """The flag that turns consumable capacity on where the release has it off: what
    docs/dra.md tells operators of 1.34 and 1.35 to give kube-apiserver and
    kube-scheduler (and nothing else, so the tier checks that this is enough)."""
    return f"--feature-gates={GATE}=true" if minor < GATE_ON_BY_DEFAULT_FROM else ""


def gate_off_args(minor: int) -> str:
    """kube-apiserver without consumable capacity: its default before 1.36, turned off
    by hand from 1.36 (a beta gate may be)."""
    return f"--feature-gates={GATE}=false" if minor >= GATE_ON_BY_DEFAULT_FROM else ""


def chart_values(minor: int) -> dict[str, Any]:
    """What an operator without GPUs sets for DRA mode on this release: below 1.36 the
    chart wants to be told that the gate is on (it refuses sharing otherwise)."""
    dra: dict[str, Any] = {"enabled": True}
    if minor < GATE_ON_BY_DEFAULT_FROM:
        dra["consumableCapacityGate"] = True
    return {"gpu": {"backend": "mock", "mockGpus": MOCK_GPUS}, "dra": dra}


def harness_scheduler_config(minor: int, version: str) -> dict[str, Any]:
    """The chart's KubeSchedulerConfiguration in DRA mode, as the harness's one
    kube-scheduler runs it: its kubeconfig, no leader election, the extender on the
    harness's port, and a default-scheduler profile beside the chart's (plain pods)."""
    from tests.chart.rendering import render, scheduler_config

    config = scheduler_config(render(chart_values(minor), kube_version=version))
    config["clientConnection"] = {"kubeconfig": "__K__/kubeconfig"}
    config["leaderElection"] = {"leaderElect": False}
    for extender in config["extenders"]:
        path = urlsplit(extender["urlPrefix"]).path
        extender["urlPrefix"] = f"http://127.0.0.1:{EXTENDER_PORT}{path}"
    config["profiles"].append({"schedulerName": "default-scheduler"})
    return config


_ENABLE_CDI = re.compile(r"^(\s*enable_cdi\s*=\s*)(true|false)\s*$", re.MULTILINE)
_CDI_DIRS = re.compile(r"^\s*cdi_spec_dirs\s*=\s*\[([^\]]*)\]", re.MULTILINE)


def enable_cdi(config: Path, containerd: str) -> str | None:
    """Turns CDI on in the containerd config prepare.sh wrote, before up.sh starts
    containerd. Returns why pods cannot get CDI devices here, None when they can.

    containerd 1.7 has CDI off by default (`enable_cdi = false` under the CRI plugin,
    spec dirs /etc/cdi and /var/run/cdi); 2.x has it on; 1.6 (Debian 12's) has none."""
    text = config.read_text()
    switch = _ENABLE_CDI.search(text)
    if switch is None:
        return (
            f"{containerd} has no CDI support (no enable_cdi in `containerd config "
            "default`; CDI came with containerd 1.7): DRA's prepared devices cannot reach "
            "a container. Put containerd 1.7+ on PATH for the pod scenarios"
        )
    dirs = _CDI_DIRS.search(text)
    if dirs is not None and CDI_DIR not in dirs.group(1):
        return f"{containerd} reads CDI specs from [{dirs.group(1)}], not {CDI_DIR}"
    if switch.group(2) == "false":
        config.write_text(_ENABLE_CDI.sub(r"\g<1>true", text))
    return None


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat, as lib.sh's pstart records it; None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(") ", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def file_tail(path: Path, lines: int = 30) -> str:
    if not path.exists():
        return f"({path} does not exist)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class LocalDraCluster(LocalCluster):
    """LocalCluster with gpushare in DRA mode: the extender (webhook only) and the DRA
    driver as host processes, no device plugin."""

    driver: HostProcess | None = None
    apiserver: HostProcess | None = None
    """Set once a test restarted kube-apiserver with other flags."""
    apiserver_args: str = ""
    """The extra flags kube-apiserver runs with now."""
    cdi_missing: str | None = None
    """Why a pod cannot get the driver's CDI devices here (None: it can)."""

    @property
    def minor(self) -> int:
        assert self.bins is not None
        return self.bins.minor

    # ----- the cluster

    def start_cluster(self) -> None:
        self.script("prepare.sh")
        containerd = run(["containerd", "--version"], check=False).stdout.strip()
        self.cdi_missing = enable_cdi(self.state / "containerd" / "config.toml", containerd)
        self.apiserver_args = gate_args(self.minor)
        config = self.state / "gpushare-dra-scheduler-config.yaml"
        config.write_text(yaml.safe_dump(harness_scheduler_config(self.minor, self.version)))
        self.script(
            "up.sh",
            SCHED_CONFIG=str(config),  # the chart's profiles and both extender entries
            NO_FAKE_DP="1",
            WITH_KCM="1",  # its resourceclaim controller makes claims from templates
            APISERVER_EXTRA_ARGS=self.apiserver_args,
            SCHED_EXTRA_ARGS=gate_args(self.minor),
        )

    def down(self) -> None:
        if self.is_up and self.driver is not None:
            self.driver.stop()
        super().down()

    def restart_apiserver(self, extra_args: str) -> None:
        """kube-apiserver again with other extra flags, recorded where up.sh records it
        so that down.sh stops it in its turn."""
        assert self.bins is not None
        if self.apiserver is not None:
            self.apiserver.stop()
        else:
            self._stop_recorded("apiserver")
        self.apiserver = HostProcess(
            "kube-apiserver",
            [str(self.scripts / "start-apiserver.sh")],
            self.logs / "apiserver.log",
            env={
                "K": str(self.state),
                "BIN": str(self.bins.directory),
                "APISERVER_EXTRA_ARGS": extra_args,
            },
        ).start()
        assert self.apiserver.process is not None
        pid = self.apiserver.process.pid
        (self.state / "apiserver.pid").write_text(f"{pid}\n")
        (self.state / "apiserver.pid.start").write_text(f"{_start_time(pid)}\n")
        self.apiserver_args = extra_args

        def ready() -> bool:
            assert self.apiserver is not None
            if not self.apiserver.alive:
                flags = extra_args or "no extra flags"
                raise RuntimeError(f"kube-apiserver ({flags}) exited:\n{self.apiserver.tail()}")
            answer = self.kubectl("get", "--raw", "/readyz", check=False, timeout=10)
            return answer.stdout.strip() == "ok"

        wait_for(f"kube-apiserver with {extra_args!r} to be ready", ready, timeout=120, every=1)

    def _stop_recorded(self, name: str) -> None:
        """Stops the process up.sh recorded in NAME.pid (PID and start time checked)."""
        try:
            pid = int((self.state / f"{name}.pid").read_text())
            recorded = (self.state / f"{name}.pid.start").read_text().strip()
        except (OSError, ValueError):
            return

        def gone() -> bool:
            return _start_time(pid) != recorded

        if gone():
            return
        os.kill(pid, signal.SIGTERM)
        try:
            wait_for(f"{name} to stop", gone, 20, every=0.25)
        except AssertionError:
            os.kill(pid, signal.SIGKILL)
            wait_for(f"{name} to die", gone, 10, every=0.25)

    # ----- gpushare in DRA mode, set up as the chart would

    def install_gpushare(self) -> None:
        from tests.chart.rendering import render

        self.our_dir.mkdir(parents=True, exist_ok=True)
        self.kubectl("create", "namespace", SYSTEM_NAMESPACE)
        self.rendered = render(
            chart_values(self.minor), namespace=SYSTEM_NAMESPACE, kube_version=self.version
        ).objects
        self.apply([o for o in self.rendered if o["kind"] in CHART_KINDS])
        cert, key, self.ca_pem = _self_signed_webhook_certificate(self.our_dir)
        self.apply(webhooks_on_loopback(self.rendered, self.ca_pem))
        # The operator's labels for a DRA node (docs/dra.md#migrating-a-node); the mode
        # label makes the node share its GPUs, core_mem with a `cores` capacity.
        self.kubectl(
            "label", "node", NODE, "ack.node.gpu.schedule=core_mem", "gpushare.io/driver=dra",
            "--overwrite",
        )  # fmt: skip
        self.health_file.write_text("")
        scheduler_kubeconfig = self.service_account_kubeconfig("scheduler")
        driver_kubeconfig = self.service_account_kubeconfig(DRA_COMPONENT, self.driver_pod())
        self.extender = HostProcess(
            "extender",
            [
                str(self.venv_bin / "gpushare-extender"),
                "--host", "127.0.0.1", "--port", str(EXTENDER_PORT),
                "--ops-port", str(EXTENDER_OPS_PORT), "--webhook-port", str(WEBHOOK_PORT),
                "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                "--kubeconfig", str(scheduler_kubeconfig),
                "--dra-claims",
            ],
            self.logs / "gpushare-extender.log",
        )  # fmt: skip
        self.driver = HostProcess(
            "DRA driver",
            [
                "nsenter", "-t", self.namespace_holder(), "-m", "--",
                str(self.venv_bin / "gpushare-dra-plugin"),
                "--node-name", NODE, "--backend", "mock", "--mock-gpus", MOCK_GPUS,
                "--mock-health-file", str(self.health_file),
                "--kubelet-root", KUBELET_ROOT, "--cdi-dir", CDI_DIR, "--state-dir", STATE_DIR,
                "--sharing", "on", "--interposer-dir=", "--metrics-port", "0",
                "--kubeconfig", str(driver_kubeconfig),
            ],
            self.logs / "gpushare-dra-plugin.log",
        )  # fmt: skip
        self.start_extender()
        self.start_driver()

    def driver_pod(self) -> str:
        """Creates DRIVER_POD: bound to NODE at creation, running as the driver's account."""
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": DRIVER_POD, "namespace": SYSTEM_NAMESPACE},
            "spec": {
                "nodeName": NODE,
                "serviceAccountName": self.service_account(DRA_COMPONENT),
                "automountServiceAccountToken": False,
                "containers": [{"name": "sleep", "image": BUSYBOX, "imagePullPolicy":
                                "IfNotPresent", "command": ["sleep", "2147483647"]}],
                "terminationGracePeriodSeconds": 0,
            },
        }  # fmt: skip
        self.create([pod])
        return DRIVER_POD

    def start_driver(self) -> None:
        """Starts the driver and waits until the kubelet confirmed its registration."""
        driver = self.driver
        assert driver is not None
        driver.start()
        wait_for(
            f"the kubelet to register DRA driver {DRIVER}",
            lambda: REGISTERED in driver.since_start() or self._dead(driver),
            timeout=60,
            every=0.2,
        )

    # ----- what the scenarios read

    def driver_log(self) -> str:
        """What the driver's current run logged."""
        assert self.driver is not None
        return self.driver.since_start()

    def node_slices(self) -> list[dict[str, Any]]:
        """The ResourceSlices of our driver for the node, as the API server stored them."""
        return [
            s
            for s in self.get("resourceslices")["items"]
            if s["spec"].get("driver") == DRIVER and s["spec"].get("nodeName") == NODE
        ]

    def delete_node_slices(self) -> None:
        for found in self.node_slices():
            self.kubectl("delete", "resourceslice", found["metadata"]["name"], "--ignore-not-found")

    def cdi_files(self) -> list[str]:
        """The CDI spec files in the kubelet's namespace (its private /run)."""
        listing = run(
            ["nsenter", "-t", self.namespace_holder(), "-m", "--",
             "sh", "-c", f"ls -1 {CDI_DIR} 2>/dev/null || true"],
            timeout=30,
        )  # fmt: skip
        return [name for name in listing.stdout.split() if name]

    def cdi_spec(self, name: str) -> str | None:
        """The text of one CDI spec file in the namespace; None when it is not there."""
        read = run(
            ["nsenter", "-t", self.namespace_holder(), "-m", "--", "cat", f"{CDI_DIR}/{name}"],
            timeout=30,
            check=False,
        )  # fmt: skip
        return read.stdout if read.returncode == 0 else None

    def diagnosis(self, *pods: str) -> str:
        """What to look at when a scenario fails: the pods, their events, the claims, the
        slices, and the tails of the logs of every part that touched them."""
        parts = []
        for name in pods:
            raw = self.kubectl("get", "pod", name, "-o", "yaml", check=False)
            parts.append(f"--- pod {name}\n{raw.stdout or raw.stderr}")
            events = self.kubectl(
                "get", "events", "--field-selector", f"involvedObject.name={name}", check=False
            )
            parts.append(f"--- events of {name}\n{events.stdout or events.stderr}")
        claims = self.kubectl("get", "resourceclaims", "-A", "-o", "yaml", check=False)
        parts.append(f"--- resourceclaims\n{claims.stdout or claims.stderr}")
        slices = self.kubectl("get", "resourceslices", "-o", "yaml", check=False)
        parts.append(f"--- resourceslices\n{slices.stdout or slices.stderr}")
        if self.driver is not None:
            parts.append(f"--- DRA driver log\n{self.driver.tail(40)}")
        if self.extender is not None:
            parts.append(f"--- extender log\n{self.extender.tail(15)}")
        for component in ("kubelet", "scheduler", "kcm", "containerd"):
            parts.append(f"--- {component} log\n{file_tail(self.logs / f'{component}.log', 25)}")
        return "\n".join(parts)
