"""nginx itself accepts the config bench/vs_nginx.py writes (``nginx -t``; skipped when nginx is
not installed: the bench never installs it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ..unit.bench.vs_nginx_module import load

pytestmark = pytest.mark.e2e

vs = load()
NGINX = vs.find_nginx(None)


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_nginx_accepts_the_config(tmp_path: Path) -> None:
    assert NGINX is not None
    user = "root" if os.geteuid() == 0 else None
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        vs.nginx_conf(vs.free_port(), ["127.0.0.1:9001", "127.0.0.1:9002"], tmp_path, user=user)
    )
    cmd = [NGINX, "-t", "-p", str(tmp_path), "-c", str(conf)]
    if vs.nginx_version(NGINX) >= (1, 19, 5):
        cmd += ["-e", str(tmp_path / "error.log")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "syntax is ok" in out.stderr
