"""HTTPS for clients, an option: served from files, the certificate reloaded when they change."""

from __future__ import annotations

import shutil
import ssl

import aiohttp
import pytest

from llmgw.agent.simulator import SimulatorServer, SimulatorSettings
from llmgw.common import pki
from llmgw.router.config import Backend, RouterConfig

from .helpers import router


def _issue(directory, into) -> None:
    """A CA in ``directory`` and a server certificate for 127.0.0.1, installed at ``into``/tls.*."""
    pki.create_ca(directory)
    crt, key = pki.issue(directory, "control", "router-https", ["127.0.0.1"])
    into.mkdir(exist_ok=True)
    for src, name in ((crt, "tls.crt"), (key, "tls.key")):
        shutil.copy(src, into / f"{name}.tmp")
        (into / f"{name}.tmp").replace(into / name)


async def _status(url: str, ca) -> int | str:
    context = ssl.create_default_context(cafile=str(ca))
    try:
        async with aiohttp.ClientSession() as http, http.get(url, ssl=context) as resp:
            return resp.status
    except aiohttp.ClientConnectorCertificateError:
        return "certificate refused"


async def test_https_serves_clients_and_a_new_certificate_without_a_restart(tmp_path):
    served = tmp_path / "served"
    _issue(tmp_path / "old", served)
    settings = SimulatorSettings(ttft_ms=1, itl_ms=1, output_tokens=2, served_model_names=("sim",))
    async with SimulatorServer(settings) as sim:
        config = RouterConfig(
            listen="127.0.0.1:0",
            https={"cert_file": str(served / "tls.crt"), "key_file": str(served / "tls.key")},
            backends=[Backend(model="tiny", url=sim.url, served_name="sim")],
        )
        async with router(config) as r:
            assert r.url.startswith("https://")
            assert await _status(r.url + "/v1/models", tmp_path / "old" / "ca.crt") == 200
            with pytest.raises(aiohttp.ClientError):
                async with aiohttp.ClientSession() as http:
                    await http.get(r.url.replace("https://", "http://") + "/v1/models")
            _issue(tmp_path / "new", served)
            assert await _status(r.url + "/v1/models", tmp_path / "new" / "ca.crt") == 200
            assert await _status(r.url + "/v1/models", tmp_path / "old" / "ca.crt") == "certificate refused"


def test_https_needs_both_files():
    with pytest.raises(ValueError, match="cert_file and key_file go together"):
        RouterConfig(
            listen="127.0.0.1:0", https={"cert_file": "a"}, backends=[Backend(model="m", url="http://h")]
        )
