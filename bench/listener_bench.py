"""The scheduler verbs' listener: loopback plain HTTP against TLS with a client
certificate (kube-scheduler's extender tlsConfig), per verb, on a 5,000-node cluster.

Both listeners serve the same extender (gpushare.extender.app.scheduler_app) in this
process; kube-scheduler's side (httpx, keep-alive as Go's client) runs in its own
process, as on a real cluster, and times each call from request to decoded answer.
filter and prioritize carry a pod and 5,000 node names (about 90 KB); bind names a
pod that does not exist (the extender answers its Error after one API lookup);
preempt carries 100 candidate nodes of 3 victims each. A fresh connection per call
is timed apart: the cost of the handshake, paid when kube-scheduler reconnects.
Both run twice, alternating, and the second round is reported.
Run: .venv/bin/python bench/listener_bench.py [--calls 300] [--nodes 5000]
"""

import argparse
import datetime
import ipaddress
import json
import multiprocessing
import ssl
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpushare.cluster.memory import MemoryCluster, gpu_node
from gpushare.extender.server import HttpServer
from gpushare.extender.service import ExtenderConfig, ExtenderService
from gpushare.inventory import parse_layout
from gpushare.objects import Pod

PREFIX = "/gpushare-scheduler"


def _key_and_name(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Name]:
    return ec.generate_private_key(ec.SECP256R1()), x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )


def _write(directory: Path, stem: str, cert: x509.Certificate, key: Any) -> tuple[Path, Path]:
    cert_file, key_file = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


def certificates(directory: Path) -> dict[str, Path]:
    """A CA, the extender's certificate for 127.0.0.1 and kube-scheduler's client one."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key, ca_name = _key_and_name("gpushare-bench-ca")

    def issue(name: x509.Name, key: Any, ca: bool, extra: list[Any]) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        for extension in extra:
            builder = builder.add_extension(extension, critical=False)
        return builder.sign(ca_key, hashes.SHA256())

    ca = issue(ca_name, ca_key, True, [])
    server_key, server_name = _key_and_name("gpushare-extender")
    san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    server = issue(server_name, server_key, False, [san])
    client_key, client_name = _key_and_name("system:kube-scheduler")
    client = issue(client_name, client_key, False, [])
    files = {"ca": _write(directory, "ca", ca, ca_key)[0]}
    files["server_cert"], files["server_key"] = _write(directory, "server", server, server_key)
    files["client_cert"], files["client_key"] = _write(directory, "client", client, client_key)
    return files


def bodies(names: list[str]) -> dict[str, bytes]:
    pod = Pod.model_validate(
        {
            "metadata": {"name": "bench", "namespace": "default", "uid": "u-bench"},
            "spec": {
                "containers": [{"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": "2"}}}]
            },
        }
    )
    manifest = {**pod.to_manifest(), "status": {}}
    victims = {
        name: {"Pods": [{"UID": f"{name}-v{i}"} for i in range(3)], "NumPDBViolations": 0}
        for name in names[:100]
    }
    args = {"Pod": manifest, "Nodes": None, "NodeNames": names}
    binding = {"PodName": "ghost", "PodNamespace": "default", "PodUID": "u", "Node": names[0]}
    return {
        "filter": json.dumps(args).encode(),
        "prioritize": json.dumps(args).encode(),
        "bind": json.dumps(binding).encode(),
        "preempt": json.dumps({"Pod": manifest, "NodeNameToMetaVictims": victims}).encode(),
    }


def scheduler_side(
    url: str, tls: dict[str, str] | None, calls: int, payloads: dict[str, bytes], out: Any
) -> None:
    verify: Any = False
    if tls is not None:
        verify = ssl.create_default_context(cafile=tls["ca"])
        verify.load_cert_chain(tls["client_cert"], tls["client_key"])
    headers = {"Content-Type": "application/json"}
    results: dict[str, list[float]] = {}
    with httpx.Client(base_url=url + PREFIX, verify=verify, headers=headers) as client:
        for verb, body in payloads.items():
            for _ in range(10):  # warm-up: connection, caches
                client.post(f"/{verb}", content=body).raise_for_status()
            samples = []
            for _ in range(calls):
                started = time.perf_counter()
                response = client.post(f"/{verb}", content=body)
                response.raise_for_status()
                response.json()
                samples.append((time.perf_counter() - started) * 1e3)
            results[verb] = samples
    samples = []
    for _ in range(max(calls // 10, 10)):  # a new connection per call: the handshake
        started = time.perf_counter()
        with httpx.Client(base_url=url + PREFIX, verify=verify, headers=headers) as client:
            client.post("/bind", content=payloads["bind"]).raise_for_status()
        samples.append((time.perf_counter() - started) * 1e3)
    results["bind, new connection"] = samples
    out.put(results)


def percentile(samples: list[float], q: int) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="timed calls per verb")
    parser.add_argument("--nodes", type=int, default=5000, help="nodes of the cluster")
    args = parser.parse_args()
    cluster = MemoryCluster()
    layout = parse_layout("4x16GiB")
    names = [f"node-{i:05d}" for i in range(args.nodes)]
    for name in names:
        cluster.add_node(gpu_node(name, layout))
    service = ExtenderService(cluster, ExtenderConfig()).start_watching()
    assert service.wait_synced(60)
    payloads = bodies(names)
    with tempfile.TemporaryDirectory() as scratch:
        tls = certificates(Path(scratch))
        plain = HttpServer(service.scheduler_app()).start()
        mutual = HttpServer(
            service.scheduler_app(),
            tls_cert_file=tls["server_cert"],
            tls_key_file=tls["server_key"],
            client_ca_file=tls["ca"],
        ).start()
        figures: dict[str, dict[str, list[float]]] = {}
        context = multiprocessing.get_context("spawn")
        runs = [("loopback", plain, None), ("mTLS", mutual, {k: str(v) for k, v in tls.items()})]
        # Two rounds, the second kept: whichever ran first would pay the warm-up alone.
        for label, server, client_tls in runs + runs:
            out = context.Queue()
            process = context.Process(
                target=scheduler_side, args=(server.url, client_tls, args.calls, payloads, out)
            )
            process.start()
            figures[label] = out.get()
            process.join()
        plain.stop()
        mutual.stop()
    service.stop_watching()
    print(f"{args.nodes} nodes, {args.calls} calls per verb, milliseconds (p50 / p99):")
    print(f"{'verb':<24}{'loopback':>20}{'TLS + client cert':>22}{'p50 extra':>12}")
    for verb in figures["loopback"]:
        row = [figures[label][verb] for label in ("loopback", "mTLS")]
        cells = [f"{percentile(s, 50):7.2f} / {percentile(s, 99):7.2f}" for s in row]
        extra = percentile(row[1], 50) - percentile(row[0], 50)
        print(f"{verb:<24}{cells[0]:>20}{cells[1]:>22}{extra:>+12.2f}")


if __name__ == "__main__":
    main()
