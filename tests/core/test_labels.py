from gpushare.labels import (
    NodeMode,
    isolation_disabled,
    node_mode,
)


def test_schedule_label_chooses_the_mode():
    assert node_mode({"ack.node.gpu.schedule": "share"}) is NodeMode.SHARE
    assert node_mode({"ack.node.gpu.schedule": "cgpu"}) is NodeMode.CGPU
    assert node_mode({"ack.node.gpu.schedule": "core_mem"}) is NodeMode.CORE_MEM


def test_legacy_labels():
    assert node_mode({"gpushare": "true"}) is NodeMode.SHARE
    assert node_mode({"cgpu": "true"}) is NodeMode.CGPU


def test_schedule_label_wins_over_legacy_labels():
    assert node_mode({"ack.node.gpu.schedule": "core_mem", "gpushare": "true"}) is (
        NodeMode.CORE_MEM
    )


def test_other_nodes_are_not_ours():
    assert node_mode({}) is None
    assert node_mode({"ack.node.gpu.schedule": "exclusive"}) is None
    assert node_mode({"gpushare": "false"}) is None


def test_only_core_mem_advertises_compute():
    assert "aliyun.com/gpu-core.percentage" in NodeMode.CORE_MEM.advertised_resources
    assert "aliyun.com/gpu-core.percentage" not in NodeMode.CGPU.advertised_resources
    assert NodeMode.SHARE.advertised_resources == ("aliyun.com/gpu-mem", "aliyun.com/gpu-count")


def test_isolation_is_off_in_share_mode_or_by_label():
    assert isolation_disabled(NodeMode.SHARE, {})
    assert not isolation_disabled(NodeMode.CGPU, {})
    assert isolation_disabled(NodeMode.CGPU, {"cgpu.disable.isolation": "true"})
    assert isolation_disabled(NodeMode.CGPU, {"cgpu.disable.isolation": "True"})
    assert not isolation_disabled(NodeMode.CGPU, {"cgpu.disable.isolation": "false"})
    assert not isolation_disabled(NodeMode.CGPU, {"cgpu.disable.isolation": ""})
