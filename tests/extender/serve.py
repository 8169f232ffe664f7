"""The extender's verbs, operational endpoints and webhook (without TLS) on loopback
over a small in-memory cluster, in a process of their own so a test can watch its
memory: `python -m tests.extender.serve BODY_DEADLINE HEADER_DEADLINE` prints
{"extender": URL, "webhook": URL} on one line and serves until stdin closes."""

import json
import sys

from gpushare.cluster.memory import MemoryCluster
from gpushare.extender.limits import ReadLimits
from gpushare.extender.server import HttpServer
from gpushare.extender.service import ExtenderConfig, ExtenderService
from tests.builders import node


def main() -> None:
    limits = ReadLimits(body_deadline=float(sys.argv[1]), header_deadline=float(sys.argv[2]))
    cluster = MemoryCluster()
    cluster.add_node(node("n1", "2x16GiB"))
    service = ExtenderService(cluster, ExtenderConfig(read_limits=limits)).start_watching()
    assert service.wait_synced(10)
    servers = {
        "extender": HttpServer(service.app(), limits=limits).start(),
        "webhook": HttpServer(service.webhook_app(), limits=limits).start(),
    }
    print(json.dumps({name: server.url for name, server in servers.items()}), flush=True)
    sys.stdin.read()
    for server in servers.values():
        server.stop()
    service.stop_watching()


if __name__ == "__main__":
    main()
