"""What the runtime makes of CDI device IDs (DRA-INTERFACES §3, "CDI facts")."""

import json

import pytest

from gpushare.standins.cdi import CdiDeviceNode, CdiError, CdiMount, resolve

KIND = "gpu.gpushare.io/gpu"


def _spec(cdi_dir, file: str, devices: dict, kind: str = KIND, **spec_edits) -> None:
    document = {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [{"name": n, "containerEdits": e} for n, e in devices.items()],
    }
    if spec_edits:
        document["containerEdits"] = spec_edits
    (cdi_dir / file).write_text(json.dumps(document))


def test_env_mounts_and_device_nodes_of_the_named_devices(tmp_path):
    _spec(
        tmp_path,
        "gpu.gpushare.io-uid-a-main.json",
        {
            "claim-uid-a-main": {
                "env": ["NVIDIA_VISIBLE_DEVICES=GPU-1", "ALIYUN_COM_GPU_MEM_CONTAINER=4"],
                "mounts": [
                    {"hostPath": "/var/lib/g", "containerPath": "/g", "options": ["ro", "bind"]}
                ],
                "deviceNodes": [{"path": "/dev/nvidia0", "permissions": "rw"}],
            },
            "claim-uid-a-other": {"env": ["OTHER=1"]},
        },
    )

    edits = resolve(tmp_path, [f"{KIND}=claim-uid-a-main"])

    assert edits.env == {"NVIDIA_VISIBLE_DEVICES": "GPU-1", "ALIYUN_COM_GPU_MEM_CONTAINER": "4"}
    assert edits.mounts == [CdiMount("/var/lib/g", "/g", ("ro", "bind"))]
    assert edits.device_nodes == [CdiDeviceNode("/dev/nvidia0", "/dev/nvidia0", "rw")]


def test_edits_merge_in_order_with_the_specs_own_edits_once_and_first(tmp_path):
    spec_mount = {"hostPath": "/usr/lib/gpushare", "containerPath": "/gpushare"}
    _spec(
        tmp_path,
        "a.json",
        {"d1": {"env": ["A=1", "SHARED=from-d1"]}, "d2": {"env": ["B=2", "A=from-d2"]}},
        env=["SPEC=1", "SHARED=from-spec"],
        mounts=[spec_mount],
    )

    edits = resolve(tmp_path, [f"{KIND}=d1", f"{KIND}=d2"])

    assert edits.env == {"SPEC": "1", "A": "from-d2", "SHARED": "from-d1", "B": "2"}
    assert edits.mounts == [CdiMount("/usr/lib/gpushare", "/gpushare")]


def test_an_id_no_spec_defines_is_unresolvable(tmp_path):
    _spec(tmp_path, "a.json", {"claim-uid-a-main": {"env": ["A=1"]}})

    with pytest.raises(CdiError, match=f"unresolvable CDI devices {KIND}=claim-uid-b-main"):
        resolve(tmp_path, [f"{KIND}=claim-uid-a-main", f"{KIND}=claim-uid-b-main"])


def test_the_kind_is_part_of_the_id(tmp_path):
    _spec(tmp_path, "a.json", {"d1": {"env": ["A=1"]}}, kind="example.com/gpu")
    with pytest.raises(CdiError, match="unresolvable"):
        resolve(tmp_path, [f"{KIND}=d1"])
    assert resolve(tmp_path, ["example.com/gpu=d1"]).env == {"A": "1"}


@pytest.mark.parametrize(
    ("devices", "why"),
    [
        ({"d1": {"env": ["A=1"]}, "d2": {}}, "empty containerEdits"),
        ({"d1": {"env": ["A=1"]}, "d2": {"env": [], "mounts": []}}, "empty containerEdits"),
        ({"d1": {"env": ["NOVALUE"]}}, "not KEY=VALUE"),
        ({"d1": {"mounts": [{"containerPath": "/g"}]}}, "hostPath"),
    ],
)
def test_a_spec_that_does_not_validate_is_left_out_whole(tmp_path, devices, why):
    _spec(tmp_path, "bad.json", devices)

    with pytest.raises(CdiError, match="unresolvable") as failed:
        resolve(tmp_path, [f"{KIND}=d1"])
    assert "bad.json" in str(failed.value) and why in str(failed.value)


def test_files_that_are_no_spec_spoil_nothing_else(tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "nokind.json").write_text(json.dumps({"devices": []}))
    _spec(tmp_path, "good.json", {"d1": {"env": ["A=1"]}})

    assert resolve(tmp_path, [f"{KIND}=d1"]).env == {"A": "1"}


def test_no_ids_need_no_directory(tmp_path):
    edits = resolve(tmp_path / "missing", [])
    assert (edits.env, edits.mounts, edits.device_nodes) == ({}, [], [])
