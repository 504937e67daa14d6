"""Who may talk to the app: a Host-header and origin policy for a tool that runs on a clinician's machine.

``HostOriginPolicy`` is an ASGI middleware in front of every route of the Gradio app (page, API, files,
uploads, login). It refuses, with 403 and one line, a request

* whose **Host** header names a host the app does not serve: the app answers only to ``localhost``, the
  loopback addresses, the address it is bound to, and the names given with ``--allowed-hosts``; when it
  is bound to every interface (``0.0.0.0`` / ``::``) also to any IP address typed as such. This is what
  stops **DNS rebinding**: a web page on ``evil.example`` whose name is made to resolve to 127.0.0.1
  reaches the app as a same-origin page, but its requests carry ``Host: evil.example:7860``;
* with an **Origin** header (browsers send it on every cross-origin request and on POSTs) that is not
  the app's own origin (scheme-less ``host:port`` equal to the Host header) or a name given with
  ``--allowed-hosts`` (a reverse proxy's public name); ``Origin: null`` (sandboxed frames, ``file://``
  pages) is refused too. A page of another site, or of another local web server (another port), can
  therefore not call the API, post an upload or log in, even with the user's cookies;
* that a browser marks ``Sec-Fetch-Site: cross-site`` and is not a top-level navigation (another
  site's ``<img>``/``<script>`` pointing at the app), so a link from an intranet page still opens it;
* for the named route of an event the page uses but the API does not offer (``api_name`` starting with
  ``_``, ``api_visibility="private"``): Gradio hides those from its API page and from gradio_client but
  still runs them for ``POST /gradio_api/call/_name``; here that answers 404 (the page calls them through
  ``/gradio_api/queue/join`` by number, which passes the checks above like every request);
* whose body (anything but ``/gradio_api/upload``, which Gradio caps at ``--max-upload-mb``) is over
  ``MAX_BODY_BYTES``: every text input is capped at 1,000 characters (``medclr.app.service``), so a
  1 MiB JSON body is already far more than any legitimate call.

Gradio 6.31 itself checks neither Host nor Origin: its CORS middleware only decides whether to add an
``Access-Control-Allow-Origin`` header (and for a non-localhost Host it allows every origin, with
credentials), so the request is still executed. ``allowed_hosts=["*"]`` turns the Host check off (a
proxy in front that checks it); the Origin check stays.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

log = logging.getLogger("medclr.app")

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = ("0.0.0.0", "::", "")
MAX_BODY_BYTES = 1 << 20  # request bodies other than uploads
UPLOAD_ROUTE = re.compile(r"/gradio_api/upload/?$")
PRIVATE_ROUTE = re.compile(r"/gradio_api/(call/v2|call|run)/_")
_NAME = re.compile(r"(\*|[A-Za-z0-9]([A-Za-z0-9\-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9\-]{0,61}[A-Za-z0-9])?)*"
                   r"|\[?[0-9A-Fa-f:.]+\]?)")


def _ip(name: str):
    try:
        return ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return None


def parse_allowed_hosts(values: Iterable[str] | None) -> list[str]:
    """``--allowed-hosts`` values (repeated and/or comma-separated) -> lower-case host names; a port or a
    scheme is refused with one line (hosts are matched without their port)."""
    from medclr.errors import MedclrError

    out: list[str] = []
    for value in values or []:
        for item in str(value).split(","):
            item = item.strip().lower()
            if not item:
                continue
            if not _NAME.fullmatch(item) or (":" in item and _ip(item) is None):
                raise MedclrError(f"--allowed-hosts {item!r}: expected a host name or IP address without scheme or "
                                  "port (e.g. cxr.hospital.org), or * to serve any Host")
            out.append(str(_ip(item)) if _ip(item) is not None else item)
    return out


def _split(netloc: str, default_port: int | None) -> tuple[str, int | None] | None:
    """'host:port' (as in a Host header) -> (lower-case host name, port); None when it does not parse."""
    try:
        parts = urlsplit("//" + netloc)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host or parts.username is not None or parts.path or parts.query:
        return None
    return host.lower().rstrip("."), port if port is not None else default_port


class HostOriginPolicy:
    """ASGI middleware: the Host / Origin / cross-site / body-size policy of the module docstring."""

    def __init__(self, app, bound: str = "127.0.0.1", allowed_hosts: Iterable[str] | None = None,
                 max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.extra = {h.lower() for h in (allowed_hosts or [])}
        self.any_host = "*" in self.extra
        bound = (bound or "").strip("[]").lower()
        self.any_ip = bound in WILDCARD_BINDS
        self.names = set(LOCAL_NAMES) | (self.extra - {"*"})
        if not self.any_ip:
            self.names.add(str(_ip(bound)) if _ip(bound) is not None else bound)
        self.max_body_bytes = max_body_bytes
        self._logged: set[tuple[str, str]] = set()

    # -- the rules ------------------------------------------------------------------------------------
    def host_allowed(self, host: str) -> bool:
        ip = _ip(host)
        if self.any_host or (ip is not None and (ip.is_loopback or self.any_ip)):
            return True
        return (str(ip) if ip is not None else host) in self.names

    def refusal(self, scope) -> tuple[int, str] | None:
        """(HTTP status, one line) when this request is refused, else None."""
        headers: dict[str, str] = {}
        for k, v in scope.get("headers") or []:
            headers.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
        default_port = 443 if scope.get("scheme") in ("https", "wss") else 80
        host = _split(headers.get("host", ""), default_port)
        if host is None:
            return 403, self._say("host", headers.get("host", ""), "request refused: no valid Host header")
        if not self.host_allowed(host[0]):
            return 403, self._say("host", host[0], "request refused: this app does not serve the host "
                                  f"{host[0][:100]!r} (start it with --allowed-hosts NAME to serve a name other "
                                  "than localhost)")
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin, host):
            return 403, self._say("origin", origin, "request refused: cross-origin requests are not accepted "
                                  f"(Origin {origin[:100]!r} is not this app's own address)")
        if headers.get("sec-fetch-site") == "cross-site" and headers.get("sec-fetch-mode") != "navigate":
            return 403, self._say("fetch", headers.get("sec-fetch-dest", ""),
                                  "request refused: another site's page may not load from this app")
        if PRIVATE_ROUTE.search(scope.get("path", "")):
            return 404, "Not found"
        length = headers.get("content-length")
        if length is not None and self._body_capped(scope):
            if not length.strip().isdigit():
                return 400, "request refused: invalid Content-Length"
            if int(length) > self.max_body_bytes:
                return 413, self._too_big()
        return None

    def origin_allowed(self, origin: str, host: tuple[str, int | None]) -> bool:
        try:
            parts = urlsplit(origin.strip())
            scheme, name, port = parts.scheme.lower(), (parts.hostname or "").lower().rstrip("."), parts.port
        except ValueError:
            return False
        if scheme not in ("http", "https") or not name or parts.path not in ("", "/"):
            return False  # includes "null" and file:// pages
        if port is None:
            port = 443 if scheme == "https" else 80
        if name in self.extra:  # the public name of a reverse proxy in front of the app
            return True
        return (name, port) == host

    def _body_capped(self, scope) -> bool:
        return scope.get("type") == "http" and not UPLOAD_ROUTE.search(scope.get("path", ""))

    def _say(self, kind: str, value: str, line: str) -> str:
        key = (kind, value[:100])
        if key not in self._logged and len(self._logged) < 256:  # each refused value logged once
            self._logged.add(key)
            log.warning("app: %s", line)
        return line

    def _too_big(self) -> str:
        return self._say("size", "", f"request refused: the request body is over {self.max_body_bytes:,} bytes")

    # -- ASGI -----------------------------------------------------------------------------------------
    async def __call__(self, scope, receive, send):
        if scope.get("type") not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        why = self.refusal(scope)
        if why is None and self._body_capped(scope) and scope.get("method") in ("POST", "PUT", "PATCH") \
                and not any(k.lower() == b"content-length" for k, _ in scope.get("headers") or []):
            # a chunked body: read it here, up to the cap, and hand it on only when it fits
            messages, size = [], 0
            while True:
                message = await receive()
                messages.append(message)
                size += len(message.get("body", b""))
                if size > self.max_body_bytes:
                    why = (413, self._too_big())
                    break
                if message.get("type") != "http.request" or not message.get("more_body", False):
                    break
            if why is None:
                pending = iter(messages)

                async def replay():
                    return next(pending, None) or await receive()

                await self.app(scope, replay, send)
                return
        if why is not None:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            from starlette.responses import PlainTextResponse

            await PlainTextResponse(why[1] + "\n", status_code=why[0])(scope, receive, send)
            return
        await self.app(scope, receive, send)
