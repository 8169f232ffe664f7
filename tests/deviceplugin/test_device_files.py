"""Device files in the Allocate answer (/dev/nvidia*), without a GPU: the nvml
backend's choice of files, on a fake /dev, behind mock GPUs."""

from pathlib import Path

from deviceplugin.gpus import DeviceNode, PhysicalGpu
from deviceplugin.mock import MockBackend
from deviceplugin.nvml import NvmlBackend
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
            return NvmlBackend(dev_root=dev).device_nodes(gpus)

    return FakeDevGpus


def test_the_files_are_the_control_devices_present_and_each_gpus_minor(tmp_path):
    dev = _fake_dev(tmp_path / "dev")
    gpu = PhysicalGpu(Gpu(0, "GPU-a", 16), minor=3)

    nodes = NvmlBackend(dev_root=dev).device_nodes([gpu])

    assert [(n.host_path, n.container_path, n.permissions) for n in nodes] == [
        (str(dev / "nvidiactl"), "/dev/nvidiactl", "rw"),
        (str(dev / "nvidia-uvm"), "/dev/nvidia-uvm", "rw"),
        (str(dev / "nvidia3"), "/dev/nvidia3", "rw"),
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
    assert all(d.host_path.startswith(str(dev)) for d in main.devices)
    assert len(main.device_ids[GPU_CORE]) == 10
