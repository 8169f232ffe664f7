"""Device files in the Allocate answer (/dev/nvidia*), without a GPU: the nvml
backend's choice of files, on a fake /dev, behind mock GPUs. The backend gets pynvml
but makes no NVML call to choose them."""

from pathlib import Path

import pynvml

from gpushare.gpunode.backends.mock import MockBackend
from gpushare.gpunode.backends.nvml import NvmlBackend
from gpushare.gpunode.backends.port import DeviceNode, PhysicalGpu
from gpushare.inventory import Gpu
from gpushare.resources import GPU_CORE


def _fake_dev(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in ("nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1"):
        (root / name).touch()
    return root


def _mock_gpus_with_files_in(dev: Path) -> type[MockBackend]:
    class FakeDevGpus(MockBackend):
        """Mock GPUs whose device files are those the nvml backend lists under `dev`."""

        def device_nodes(self, gpus: list[PhysicalGpu]) -> list[DeviceNode]:
            return NvmlBackend(pynvml, dev_root=dev).device_nodes(gpus)

    return FakeDevGpus


def test_the_files_are_the_control_devices_present_and_each_gpus_minor(tmp_path):
    dev = _fake_dev(tmp_path / "dev")
    gpu = PhysicalGpu(Gpu(0, "GPU-a", 16), minor=3)

    nodes = NvmlBackend(pynvml, dev_root=dev).device_nodes([gpu])

    # Looked for under the dev root (the node's /dev as the plugin sees it), named by
    # their path on the node, where the kubelet resolves them.
    assert [(n.host_path, n.container_path, n.permissions) for n in nodes] == [
        ("/dev/nvidiactl", "/dev/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", "/dev/nvidia-uvm", "rw"),
        ("/dev/nvidia3", "/dev/nvidia3", "rw"),
    ]


def test_control_files_are_looked_for_again_at_each_answer(tmp_path):
    """nvidia-uvm appears on the node when the UVM module loads, often after the plugin
    started (the first CUDA program loads it)."""
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidiactl").touch()
    backend = NvmlBackend(pynvml, dev_root=dev)
    gpu = PhysicalGpu(Gpu(0, "GPU-a", 16), minor=0)
    assert [n.container_path for n in backend.device_nodes([gpu])] == [
        "/dev/nvidiactl",
        "/dev/nvidia0",
    ]

    for name in ("nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
        (dev / name).touch()

    assert [n.host_path for n in backend.device_nodes([gpu])] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
        "/dev/nvidia0",
    ]


def test_the_memory_answer_carries_the_files_of_the_containers_gpus(make_rig, tmp_path):
    dev = _fake_dev(tmp_path / "dev")
    backend_type = _mock_gpus_with_files_in(dev)
    rig = make_rig(layout="2x16GiB", mode="core_mem", backend_type=backend_type).start()
    pod = rig.bind("p", [[1]], mem=2, core=10)

    [main] = rig.kubelet.admit(pod)

    assert [d.container_path for d in main.devices] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia1",
    ]
    assert [d.host_path for d in main.devices] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia1",
    ]
    # read-write, as the NVIDIA device plugin hands them: CUDA opens them for writing
    assert [d.permissions for d in main.devices] == ["rw", "rw", "rw"]
    assert len(main.device_ids[GPU_CORE]) == 10


def test_the_dev_root_flag_and_env_reach_the_backend(tmp_path, monkeypatch):
    from gpushare.deviceplugin.main import build_parser
    from gpushare.gpunode.backendflags import build_backend

    monkeypatch.delenv("GPUSHARE_DRIVER_ROOT", raising=False)
    monkeypatch.delenv("GPUSHARE_DEV_ROOT", raising=False)
    assert build_backend(build_parser().parse_args(["--node-name=n1"])).dev_root == Path("/dev")

    flagged = build_parser().parse_args(["--node-name=n1", f"--dev-root={tmp_path}"])
    assert build_backend(flagged).dev_root == tmp_path

    monkeypatch.setenv("GPUSHARE_DEV_ROOT", str(tmp_path / "env"))
    assert build_backend(build_parser().parse_args(["--node-name=n1"])).dev_root == (
        tmp_path / "env"
    )


def test_the_start_line_names_the_dev_root_and_what_it_holds(tmp_path, caplog):
    """What docs/install.md tells an operator to look for in the plugin's log."""
    from gpushare.deviceplugin.main import _device_files

    dev = _fake_dev(tmp_path / "dev")
    assert _device_files(NvmlBackend(pynvml, dev_root=dev)) == (
        f" dev-root={dev} control-devices=nvidiactl,nvidia-uvm"
    )
    assert "no nvidiactl" not in caplog.text

    empty = tmp_path / "empty"
    empty.mkdir()
    assert _device_files(NvmlBackend(pynvml, dev_root=empty)).endswith("control-devices=none")
    assert f"no nvidiactl under --dev-root {empty}" in caplog.text
    assert _device_files(MockBackend.from_layout("1x16GiB", "n1", tmp_path / "health")) == ""
