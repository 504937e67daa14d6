"""The app's Host-header / origin policy (issue 17: DNS rebinding, cross-origin calls, body caps), on a bare
ASGI app (fast) and on the real Gradio app."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest_app import app_assets, engine, free_port, index_dir, served_app  # noqa: F401 - fixtures

os.environ["HF_HUB_OFFLINE"] = "1"


def _echo_app():
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def echo(request):
        body = await request.body()
        return PlainTextResponse(f"ok {len(body)}")

    return Starlette(routes=[Route("/{path:path}", echo, methods=["GET", "POST"])])


def _client(bound="127.0.0.1", allowed=None, port=7860):
    from starlette.testclient import TestClient

    from medclr.app.hosts import HostOriginPolicy

    return TestClient(HostOriginPolicy(_echo_app(), bound=bound, allowed_hosts=allowed),
                      base_url=f"http://127.0.0.1:{port}")


@pytest.mark.parametrize("host, ok", [
    ("127.0.0.1:7860", True), ("localhost:7860", True), ("LOCALHOST:7860", True), ("[::1]:7860", True),
    ("127.0.0.2:7860", True),  # any loopback address
    ("localhost", True),  # the port is not part of the check
    ("evil.example:7860", False),  # DNS rebinding: a name the attacker controls, resolved to 127.0.0.1
    ("localhost.evil.example:7860", False), ("127.0.0.1.nip.io:7860", False),
    ("192.168.1.5:7860", False),  # bound to 127.0.0.1: only loopback
    ("", False), ("user@127.0.0.1:7860", False),
])
def test_host_header_on_a_loopback_bind(host, ok):
    r = _client().get("/config", headers={"host": host})
    assert (r.status_code == 200) is ok, (host, r.status_code, r.text)
    if not ok:
        assert r.status_code == 403 and r.text.count("\n") == 1 and r.text.startswith("request refused")


def test_hosts_on_a_wildcard_bind_and_allowed_names():
    c = _client(bound="0.0.0.0")
    assert c.get("/", headers={"host": "192.168.1.5:7860"}).status_code == 200  # an IP typed as such
    assert c.get("/", headers={"host": "cxr-ws01:7860"}).status_code == 403  # a name must be allowed
    c = _client(bound="0.0.0.0", allowed=["cxr-ws01", "cxr.hospital.org"])
    for host in ("cxr-ws01:7860", "CXR.hospital.org", "127.0.0.1:7860"):
        assert c.get("/", headers={"host": host}).status_code == 200, host
    assert c.get("/", headers={"host": "evil.example"}).status_code == 403
    c = _client(bound="cxr-ws01")
    assert c.get("/", headers={"host": "cxr-ws01:7860"}).status_code == 200
    assert c.get("/", headers={"host": "10.0.0.1:7860"}).status_code == 403
    c = _client(allowed=["*"])  # the Host check off (a proxy checks it); origins still checked
    assert c.get("/", headers={"host": "anything.example"}).status_code == 200
    r = c.post("/gradio_api/call/ground", headers={"host": "a.example", "origin": "http://b.example"}, json={})
    assert r.status_code == 403


@pytest.mark.parametrize("origin, ok", [
    ("http://127.0.0.1:7860", True),  # the page itself
    ("http://evil.example", False), ("http://127.0.0.1:8888", False),  # another local web server
    ("https://127.0.0.1:7860", True),  # the same host and port is the same server (TLS in front)
    ("null", False), ("file://", False), ("http://127.0.0.1:7860/x", False),
])
def test_origin(origin, ok):
    r = _client().post("/gradio_api/queue/join", headers={"origin": origin}, json={"data": []})
    assert (r.status_code == 200) is ok, (origin, r.status_code, r.text)


def test_origin_of_a_reverse_proxy_and_cross_site_fetches():
    c = _client(allowed=["cxr.hospital.org"])
    r = c.post("/x", headers={"origin": "https://cxr.hospital.org"}, json={})
    assert r.status_code == 200  # the proxy rewrites Host to 127.0.0.1:7860; its public name is allowed
    # another site's <img>/<script> pointing at the app: refused; a link from another site: served
    c = _client()
    assert c.get("/gradio_api/file=x", headers={"sec-fetch-site": "cross-site", "sec-fetch-mode": "no-cors"}
                 ).status_code == 403
    assert c.get("/", headers={"sec-fetch-site": "cross-site", "sec-fetch-mode": "navigate"}).status_code == 200
    assert c.get("/", headers={"sec-fetch-site": "same-origin", "sec-fetch-mode": "cors"}).status_code == 200


def test_body_caps_and_private_routes():
    from medclr.app.hosts import MAX_BODY_BYTES

    c = _client()
    assert c.post("/gradio_api/call/ground", content=b"x" * (MAX_BODY_BYTES + 1)).status_code == 413
    assert c.post("/gradio_api/call/ground", content=b"x" * 1000).text == "ok 1000"

    def chunks(n):
        for _ in range(n):
            yield b"x" * (1 << 18)

    assert c.post("/gradio_api/queue/join", content=chunks(5)).status_code == 413  # chunked, no Content-Length
    assert c.post("/gradio_api/queue/join", content=chunks(2)).text == f"ok {2 << 18}"
    # uploads are capped by Gradio (--max-upload-mb), not here
    assert c.post("/gradio_api/upload", content=b"x" * (MAX_BODY_BYTES + 1)).status_code == 200
    for route in ("/gradio_api/call/_analyse_ground", "/gradio_api/call/v2/_pick_study", "/gradio_api/run/_clear"):
        assert c.post(route, json={"data": []}).status_code == 404
    assert c.post("/gradio_api/call/ground", json={"data": []}).status_code == 200


def test_allowed_hosts_option():
    from medclr.app.hosts import parse_allowed_hosts
    from medclr.errors import MedclrError

    assert parse_allowed_hosts(["cxr.hospital.org,CXR-WS01", "10.1.2.3", "[::1]", "*"]) == [
        "cxr.hospital.org", "cxr-ws01", "10.1.2.3", "::1", "*"]
    for bad in ("cxr.hospital.org:8080", "http://cxr", "*.hospital.org", "a b"):
        with pytest.raises(MedclrError, match="--allowed-hosts"):
            parse_allowed_hosts([bad])




def test_real_app_refuses_rebinding_and_cross_origin_calls(engine, tmp_path):  # noqa: F811
    """The Gradio app as served: DNS rebinding and cross-origin requests refused on every route (page, config,
    upload, queue, named API, files); the page's own requests, gradio_client and an allowed name served."""
    import httpx
    from gradio_client import Client

    from medclr.app.service import AppService
    from medclr.app.ui import build_blocks, launch

    demo = build_blocks(AppService(engine, None))
    port = free_port()
    _, url = launch(demo, port=port, block=False, allowed_hosts=["cxr.hospital.org"])
    url = url.rstrip("/")
    try:
        call = {"data": [None, "effusion", "absolute"]}
        routes = [("GET", "/", None), ("GET", "/config", None), ("GET", "/gradio_api/info", None),
                  ("POST", "/gradio_api/call/ground", call), ("POST", "/gradio_api/queue/join", {"data": []}),
                  ("GET", "/gradio_api/file=/etc/hostname", None)]
        with httpx.Client(timeout=60) as h:
            for method, route, body in routes:
                for headers in ({"host": f"evil.example:{port}"}, {"origin": "http://evil.example"},
                                {"host": f"evil.example:{port}", "origin": f"http://evil.example:{port}"}):
                    r = h.request(method, url + route, headers=headers, json=body)
                    assert r.status_code == 403 and "request refused" in r.text, (route, headers, r.status_code)
            r = h.post(url + "/gradio_api/upload", headers={"origin": "http://evil.example"},
                       files={"files": ("x.png", b"123")})
            assert r.status_code == 403
            # the page's own requests, and the names it is allowed to serve under
            for headers in ({}, {"origin": url}, {"host": f"localhost:{port}", "origin": f"http://localhost:{port}"},
                            {"host": "cxr.hospital.org"}):
                assert h.get(url + "/config", headers=headers).status_code == 200, headers
            r = h.post(url + "/gradio_api/call/ground", headers={"origin": url}, json=call)
            assert r.status_code == 200 and "event_id" in r.json()
            # an event the page uses but the API does not offer: not callable by name
            r = h.post(url + "/gradio_api/call/_analyse_ground", json=call)
            assert r.status_code == 404
            r = h.post(url + "/gradio_api/call/ground", content=json.dumps({"data": ["x" * (2 << 20)]}),
                       headers={"content-type": "application/json"})
            assert r.status_code == 413
        client = Client(url, verbose=False, analytics_enabled=False, download_files=False)
        assert set(client.view_api(print_info=False, return_format="dict")["named_endpoints"]) == {
            "/preview", "/zero_shot", "/ground", "/retrieve_by_image", "/retrieve_by_text", "/inspect_sentence"}
    finally:
        demo.close()
