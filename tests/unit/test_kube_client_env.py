"""The operator's client does not consult the environment (~/.netrc, proxy variables) per
request (core/kube.py distrust_env): against a real HTTP server on loopback, a netrc entry
for it that aiohttp would otherwise send as Basic auth is not sent."""
from __future__ import annotations

import asyncio

from aiohttp import web
from kubernetes_asyncio import client

from chattts_operator.core.kube import Kube, distrust_env


async def authorization_seen(tmp_path, monkeypatch, distrust: bool) -> str | None:
    seen: list[str | None] = []

    async def configmap(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"kind": "ConfigMap", "metadata": {"name": "c"}})

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/configmaps/c", configmap)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password secret\n")
    monkeypatch.setenv("NETRC", str(netrc))
    configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
    api = client.ApiClient(configuration)
    if distrust:
        distrust_env(api)
    try:
        assert (await Kube(api).get("ConfigMap", "ns", "c"))["metadata"]["name"] == "c"
    finally:
        await api.close()
        await runner.cleanup()
    return seen[0]


def test_the_client_sends_no_netrc_credentials(tmp_path, monkeypatch):
    # As kubernetes_asyncio builds it, the session reads the netrc (in a thread, per request) ...
    assert asyncio.run(authorization_seen(tmp_path, monkeypatch, distrust=False)) is not None
    # ... and ours does not.
    assert asyncio.run(authorization_seen(tmp_path, monkeypatch, distrust=True)) is None
