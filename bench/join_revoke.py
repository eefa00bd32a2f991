"""How long a join takes, and how soon a revocation ends an open stream, on real processes.

One cluster as the tests start it (tests/support/cluster.py: real etcd, a
control plane with mutual TLS and a join port, no node), then:

- **join**: ``--joins`` times, a token is created (JoinTokenService) and a
  node joins with it (common/joining.py: discovery of the pinned CA, key and
  CSR, Join); the time of ``join()`` alone;
- **revocation**: ``--revocations`` router certificates each open an
  EndpointService.Watch and read its snapshot; each is then revoked by
  serial (CertificateService) and the time from the revoke call to the
  stream's PERMISSION_DENIED is taken (the etcd write, its watch event,
  the control plane's list, the stream's task cancelled).

    .venv/bin/python bench/join_revoke.py              # about 20 s
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmgw.common import pki  # noqa: E402
from llmgw.common.joining import join  # noqa: E402
from llmgw.v1 import endpoints_pb2, endpoints_pb2_grpc, trust_pb2, trust_pb2_grpc  # noqa: E402
from tests.support.cluster import running_cluster  # noqa: E402


def _ms(values: list[float]) -> str:
    values = sorted(values)
    return f"p50 {statistics.median(values) * 1000:.1f} ms, max {values[-1] * 1000:.1f} ms (n={len(values)})"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--joins", type=int, default=10)
    ap.add_argument("--revocations", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        with running_cluster(
            state,
            [],
            name="bench",
            nodes={},
            control={"join": {"ca_key_file": str(state / "tls" / "ca.key"), "listen": "127.0.0.1:0"}},
        ) as c:
            with c.channel() as ch:
                tokens = trust_pb2_grpc.JoinTokenServiceStub(ch)
                certs = trust_pb2_grpc.CertificateServiceStub(ch)
                created = c.wait_for(
                    lambda: tokens.CreateJoinToken(
                        trust_pb2.CreateJoinTokenRequest(max_uses=1000), timeout=5
                    ),
                    30,
                    "the control plane answers",
                )
                joins = []
                for i in range(args.joins):
                    t0 = time.perf_counter()
                    join(created.join_address, created.secret, created.ca_cert_hash, f"bench-{i}", [])
                    joins.append(time.perf_counter() - t0)
                cuts = []
                for i in range(args.revocations):
                    tls = c.pki.settings("router", f"bench-{i}")
                    serial = pki.serial_hex(pki.load_certs(Path(tls.cert_file).read_bytes())[0].serial_number)
                    ended = threading.Event()
                    ended_at = [0.0]
                    with c.channel(tls=tls) as rch:
                        watch = endpoints_pb2_grpc.EndpointServiceStub(rch).Watch(
                            endpoints_pb2.WatchRequest(), timeout=30
                        )
                        next(watch)

                        def drain(watch=watch, ended=ended, ended_at=ended_at) -> None:
                            try:
                                for _ in watch:
                                    pass
                            except grpc.RpcError as err:
                                assert err.code() == grpc.StatusCode.PERMISSION_DENIED, err
                            ended_at[0] = time.perf_counter()
                            ended.set()

                        reader = threading.Thread(target=drain)
                        reader.start()
                        t0 = time.perf_counter()
                        certs.RevokeCertificate(trust_pb2.RevokeCertificateRequest(serial=serial), timeout=5)
                        assert ended.wait(10), "the stream was not ended"
                        reader.join()
                        cuts.append(ended_at[0] - t0)
    print(f"join (discovery + CSR + Join): {_ms(joins)}")
    print(f"revoke call -> open stream ended: {_ms(cuts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
