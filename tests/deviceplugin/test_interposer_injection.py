"""Allocate loads the CUDA interposer into containers whose memory is capped: the library,
the preload file and the container's grant (what the node decided) read-only, the grant's
own accounting directory read-write, and GPUSHARE_CUDA_REGION naming the region in it
(gpunode/interposer.py)."""

import logging
from pathlib import Path

import pytest

from gpushare import grant as grants
from gpushare.environment import (
    ACCOUNTING_DIR_IN_CONTAINER,
    CUDA_REGION,
    GRANT_IN_CONTAINER,
    INTERPOSER_IN_CONTAINER,
    ContainerLimits,
)
from gpushare.gpunode.interposer import InterposerMounts, grant_mounted
from gpushare.resources import GPU_CORE, GPU_MEM
from tests.builders import container, pod
from tests.deviceplugin.rig import eventually


def installed(directory: Path) -> Path:
    """The interposer directory as the isolation agent leaves it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "libgpushare-cuda.so").write_bytes(b"\x7fELF")
    (directory / "ld.so.preload").write_text(f"{INTERPOSER_IN_CONTAINER}\n")
    return directory


def mounted(admitted) -> dict[str, tuple[str, bool]]:
    return {m.container_path: (m.host_path, m.read_only) for m in admitted.mounts}


def granted(admitted) -> grants.Grant:
    """The grant the container was given, read from the node's side of its mount."""
    return grants.decode(Path(mounted(admitted)[GRANT_IN_CONTAINER][0]).read_bytes())


def grant_folders(directory: Path) -> list[Path]:
    root = directory / "grants"
    return sorted(root.iterdir()) if root.is_dir() else []


def test_a_capped_container_gets_the_library_the_preload_file_and_its_own_region(
    make_rig, short_tmp
):
    directory = installed(short_tmp / "interposer")
    rig = make_rig(layout="2x16GiB", mode="cgpu", interposer_dir=directory).start()
    pod = rig.bind("train", [[1]], mem=4)

    [main] = rig.kubelet.admit(pod)

    [folder] = grant_folders(directory)
    assert mounted(main) == {
        INTERPOSER_IN_CONTAINER: (str(directory / "libgpushare-cuda.so"), True),
        "/etc/ld.so.preload": (str(directory / "ld.so.preload"), True),
        GRANT_IN_CONTAINER: (str(folder / "grant"), True),
        ACCOUNTING_DIR_IN_CONTAINER: (str(folder / "region"), False),
    }
    assert main.envs[CUDA_REGION] == f"{ACCOUNTING_DIR_IN_CONTAINER}/cuda-region"
    accounting = folder / "region"
    assert accounting.is_dir() and accounting.stat().st_mode & 0o777 == 0o777
    assert (folder / "grant").stat().st_mode & 0o777 == 0o644


def test_the_grant_holds_what_the_node_decided_for_the_container(make_rig, short_tmp):
    directory = installed(short_tmp / "interposer")
    rig = make_rig(layout="2x16GiB", mode="core_mem", interposer_dir=directory).start()
    pod = rig.bind("train", [[1]], mem=4, core=30)

    [main] = rig.kubelet.admit(pod)

    grant = granted(main)
    assert Path(mounted(main)[GRANT_IN_CONTAINER][0]).parent.name == grant.id
    assert (grant.pod_uid, grant.pod_key, grant.container) == (
        pod.metadata.uid,
        pod.key,
        "main",
    )
    assert grant.indices == (1,)
    assert grant.uuids == tuple(main.envs["NVIDIA_VISIBLE_DEVICES"].split(","))
    assert grant.mem_bytes == (4 << 30,)
    # The compute percentage rides on the core answer's environment, but is granted too.
    assert grant.core_percent == (30,)
    assert grant.region == f"{ACCOUNTING_DIR_IN_CONTAINER}/cuda-region"


def test_each_allocate_answer_gets_a_grant_of_its_own(make_rig, short_tmp):
    """Two pods admitted in the other order than the plugin matched them still never
    share a region: the region belongs to the answer, not to a pod's name."""
    directory = installed(short_tmp / "interposer")
    rig = make_rig(layout="1x16GiB", mode="cgpu", interposer_dir=directory).start()
    first = rig.bind("first", [[0]], mem=2)
    second = rig.bind("second", [[0]], mem=2)

    [a] = rig.kubelet.admit(first)
    [b] = rig.kubelet.admit(second)

    assert mounted(a)[ACCOUNTING_DIR_IN_CONTAINER] != mounted(b)[ACCOUNTING_DIR_IN_CONTAINER]
    assert granted(a).id != granted(b).id
    assert len(grant_folders(directory)) == 2


def test_each_container_of_a_pod_gets_a_region_of_its_own(make_rig, short_tmp):
    directory = installed(short_tmp / "interposer")
    rig = make_rig(layout="2x16GiB", mode="cgpu", interposer_dir=directory).start()
    pod = rig.bind("two", [[0], [1]], containers=[container("a", 2), container("b", 3)])

    a, b = rig.kubelet.admit(pod)

    assert mounted(a)[ACCOUNTING_DIR_IN_CONTAINER] != mounted(b)[ACCOUNTING_DIR_IN_CONTAINER]
    assert (granted(a).container, granted(a).mem_bytes) == ("a", (2 << 30,))
    assert (granted(b).container, granted(b).mem_bytes) == ("b", (3 << 30,))


def test_memory_and_compute_answers_carry_the_mounts_once(make_rig, short_tmp):
    directory = installed(short_tmp / "interposer")
    rig = make_rig(layout="1x16GiB", mode="core_mem", interposer_dir=directory).start()
    pod = rig.bind("paced", [[0]], mem=4, core=30)

    [main] = rig.kubelet.admit(pod)

    assert set(main.device_ids) == {GPU_MEM, GPU_CORE}
    assert len(main.mounts) == 4 and main.duplicate_envs == []
    assert CUDA_REGION in main.envs


@pytest.mark.parametrize(
    ("mode", "kwargs", "env"),
    [
        ("share", {"mem": 4}, None),  # share mode caps nothing
        ("cgpu", {"count": 1}, None),  # a whole GPU is the container's own
        ("cgpu", {"mem": 4}, "true"),  # the pod turned cGPU off (ACK's CGPU_DISABLE)
    ],
    ids=["share-mode", "whole-gpu", "pod-sets-CGPU_DISABLE"],
)
def test_nothing_is_loaded_where_memory_is_not_capped(make_rig, short_tmp, mode, kwargs, env):
    directory = installed(short_tmp / "interposer")
    rig = make_rig(layout="1x16GiB", mode=mode, interposer_dir=directory).start()
    spec = container("main", **kwargs)
    if env is not None:
        spec["env"] = [{"name": "CGPU_DISABLE", "value": env}]
    pod = rig.bind("free", [[0]], containers=[spec])

    [main] = rig.kubelet.admit(pod)

    assert main.mounts == [] and CUDA_REGION not in main.envs
    assert grant_folders(directory) == []


def test_a_pod_setting_cgpu_disable_false_still_gets_it(make_rig, short_tmp):
    directory = installed(short_tmp / "interposer")
    rig = make_rig(layout="1x16GiB", mode="cgpu", interposer_dir=directory).start()
    spec = container("main", 4)
    spec["env"] = [{"name": "CGPU_DISABLE", "value": "false"}]

    [main] = rig.kubelet.admit(rig.bind("kept", [[0]], containers=[spec]))

    assert CUDA_REGION in main.envs


def test_until_the_agent_installed_the_library_containers_start_without_it(make_rig, short_tmp):
    directory = short_tmp / "interposer"
    rig = make_rig(layout="1x16GiB", mode="cgpu", interposer_dir=directory).start()

    [main] = rig.kubelet.admit(rig.bind("early", [[0]], mem=2))

    assert main.mounts == [] and CUDA_REGION not in main.envs
    installed(directory)
    [later] = rig.kubelet.admit(rig.bind("later", [[0]], mem=2))
    assert len(later.mounts) == 4


def test_an_accounting_directory_that_cannot_be_made_leaves_the_container_without_it(
    make_rig, short_tmp, caplog
):
    directory = installed(short_tmp / "interposer")
    (directory / "grants").write_text("a file where the directory should be")
    rig = make_rig(layout="1x16GiB", mode="cgpu", interposer_dir=directory).start()

    [main] = rig.kubelet.admit(rig.bind("unlucky", [[0]], mem=2))

    assert main.mounts == [] and main.envs["ALIYUN_COM_GPU_MEM_CONTAINER"] == "2"
    assert "starts without the CUDA interposer" in caplog.text


def test_the_grants_and_regions_of_deleted_pods_are_removed(make_rig, short_tmp):
    directory = installed(short_tmp / "interposer")
    # What a plugin before grants left: an accounting directory by pod UID and name.
    legacy = directory / "regions" / "uid-of-a-pod-gone-before-the-upgrade" / "main"
    legacy.mkdir(parents=True)
    rig = make_rig(layout="1x16GiB", mode="cgpu", interposer_dir=directory).start()
    gone = rig.bind("gone", [[0]], mem=2)
    [answer] = rig.kubelet.admit(gone)
    folder = Path(mounted(answer)[GRANT_IN_CONTAINER][0]).parent
    half_made = directory / "grants" / ("f" * 32)  # an Allocate between mkdir and write
    half_made.mkdir()
    rig.cluster.delete_pod("default", "gone")
    assert eventually(lambda: gone.metadata.uid not in rig.plugin.queue.uids())

    kept = rig.bind("next", [[0]], mem=2)
    [answer] = rig.kubelet.admit(kept)

    assert eventually(lambda: not folder.exists())
    assert not legacy.parent.exists()
    assert half_made.is_dir()
    assert Path(mounted(answer)[GRANT_IN_CONTAINER][0]).is_file()


def test_without_an_interposer_directory_nothing_is_injected(make_rig):
    rig = make_rig(layout="1x16GiB", mode="cgpu").start()
    [main] = rig.kubelet.admit(rig.bind("plain", [[0]], mem=2))
    assert main.mounts == [] and CUDA_REGION not in main.envs


def a_limits(pod: str = "team/train") -> ContainerLimits:
    return ContainerLimits(
        pod=pod,
        container="main",
        gpu_uuids=("GPU-a",),
        gpu_indices=(0,),
        mem_gib=(2,),
        dev_mem_gib=(16,),
        core_percent=(0,),
    )


def test_a_grant_is_renamed_to_the_pod_that_runs_under_it(short_tmp, caplog):
    mounts = InterposerMounts(installed(short_tmp / "interposer"))
    injection = mounts.for_container("uid-a", a_limits())
    assert injection is not None
    grant_id = grant_mounted(injection.mounts)
    holder = pod("other", namespace="elsewhere")

    with caplog.at_level(logging.INFO):
        assert mounts.relabel(grant_id, holder, "side")

    grant = grants.decode((mounts.grant_dir(grant_id) / "grant").read_bytes())
    assert (grant.pod_uid, grant.pod_key, grant.container) == (
        "uid-other",
        "elsewhere/other",
        "side",
    )
    assert grant.mem_bytes == (2 << 30,)
    assert f"grant {grant_id} now names elsewhere/other container side" in caplog.text


def test_a_grant_that_cannot_be_renamed_says_so(short_tmp, caplog):
    mounts = InterposerMounts(installed(short_tmp / "interposer"))
    holder = pod("other", namespace="elsewhere")
    with caplog.at_level(logging.WARNING):
        assert not mounts.relabel("0" * 32, holder, "side")
    assert f"grant {'0' * 32} cannot be corrected to elsewhere/other: " in caplog.text


def test_an_answer_without_a_grant_mounts_none():
    assert grant_mounted([]) == ""


def test_prune_says_which_pods_it_removed(short_tmp, caplog):
    directory = installed(short_tmp / "interposer")
    mounts = InterposerMounts(directory)
    kept = mounts.for_container("uid-kept", a_limits())
    gone = mounts.for_container("uid-gone", a_limits("team/gone"))
    assert kept is not None and gone is not None
    (directory / "regions").mkdir()
    (directory / "regions" / "uid-old").mkdir()
    (directory / "regions" / "a-file").write_text("not a pod's directory")

    with caplog.at_level(logging.INFO):
        assert mounts.prune({"uid-kept"}) == ["uid-gone", "uid-old"]

    assert (directory / "regions" / "a-file").is_file()
    assert mounts.grant_dir(grant_mounted(kept.mounts)).is_dir()
    assert not mounts.grant_dir(grant_mounted(gone.mounts)).exists()
    assert "removed the grants and accounting directories of 2 pod(s) gone" in caplog.text
