"""grpc and tritonclient are an optional extra: without them the gateway imports, builds and
serves HTTP when no ``gateway.grpc_port`` is set (its gRPC front and codec are imported only
when one is)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    for name in ("grpc", "tritonclient", "google.protobuf"):
        sys.modules[name] = None  # importing it raises ImportError
    from evenserve.cli.main import main  # noqa: F401
    from evenserve.cluster.file import parse_cluster
    from evenserve.gateway.server import Gateway

    raw = {"gateway": {"grpc_forward": "http"},
           "backends": [{"name": "a", "url": "http://127.0.0.1:9", "models": ["m"]}]}
    g = Gateway(parse_cluster(raw, Path(".")))

    async def run():
        await g.startup()
        await g.shutdown()

    asyncio.run(run())
    assert g.grpc is None
    gone = [m for m in ("evenserve.gateway.grpc_front", "evenserve.gateway.grpc_codec")
            if m in sys.modules]
    assert not gone, gone
    print("ok")
    """
)


def test_the_gateway_runs_without_the_grpc_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")
