"""Drive the Python `mcp` SDK's OAuthClientProvider headlessly against provider.mjs.

A stand-in for the gateway: an SDK MCPServer on loopback whose TokenVerifier checks the
provider's RS256 JWTs (PyJWT against the JWKS: iss, aud = its /mcp URL, exp, scope). The
client starts with no token, gets a 401, discovers the protected-resource metadata and the
authorization server, registers dynamically, runs authorization code + PKCE by following the
redirects with an HTTP client (no browser), and calls a tool that echoes the caller's claims.

    .venv/bin/python tests/npm/oidc/sdk_probe.py

This is the recipe the Rust-side Python tests can copy; it is not part of any suite.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urljoin, urlparse

import anyio
import httpx2
import jwt
import uvicorn
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver.server import MCPServer
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

HERE = Path(__file__).resolve().parent
REDIRECT_URI = "http://127.0.0.1:9/callback"  # never listened on: the redirect is read, not followed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MemoryStorage(TokenStorage):
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


class HeadlessBrowser:
    """redirect_handler + callback_handler: follow the authorization URL's redirects with a
    cookie-keeping client until one points at the redirect URI, and hand its query back."""

    def __init__(self) -> None:
        self.result: AuthorizationCodeResult | None = None
        self.hops: list[str] = []

    async def redirect_handler(self, url: str) -> None:
        async with httpx2.AsyncClient(follow_redirects=False, timeout=10) as http:
            for _ in range(10):
                self.hops.append(url)
                response = await http.get(url)
                location = response.headers.get("location")
                if response.status_code not in (302, 303) or not location:
                    raise RuntimeError(f"authorization stopped at {url}: HTTP {response.status_code} {response.text[:300]}")
                location = urljoin(url, location)
                if location.startswith(REDIRECT_URI):
                    query = parse_qs(urlparse(location).query)
                    if "error" in query:
                        raise RuntimeError(f"authorization error: {query}")
                    self.result = AuthorizationCodeResult(
                        code=query["code"][0], state=query.get("state", [None])[0], iss=query.get("iss", [None])[0]
                    )
                    return
                url = location
        raise RuntimeError("no redirect to the callback after 10 hops")

    async def callback_handler(self) -> AuthorizationCodeResult:
        assert self.result is not None
        result, self.result = self.result, None
        return result


class JwtVerifier:
    """What the gateway will do, in a few lines: RS256 only, iss, aud, exp, kid from the JWKS."""

    def __init__(self, issuer: str, jwks_uri: str, audience: str) -> None:
        self.issuer, self.audience = issuer, audience
        self.jwks = jwt.PyJWKClient(jwks_uri, cache_keys=True)

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            key = await anyio.to_thread.run_sync(self.jwks.get_signing_key_from_jwt, token)
            claims = jwt.decode(
                token, key.key, algorithms=["RS256"], audience=self.audience, issuer=self.issuer,
                options={"require": ["exp", "iat", "sub", "aud", "iss"]}, leeway=5,
            )
        except jwt.PyJWTError as e:
            print(f"  verifier: rejected ({e})", file=sys.stderr)
            return None
        return AccessToken(
            token=token, client_id=claims["client_id"], scopes=claims.get("scope", "").split(),
            expires_at=claims["exp"], resource=claims["aud"], subject=claims["sub"], claims=claims,
        )


async def main() -> None:
    mcp_port = free_port()
    resource = f"http://127.0.0.1:{mcp_port}/mcp"
    provider = subprocess.Popen(
        ["node", str(HERE / "provider.mjs"), "--port", "0", "--resource", resource, "--login", "alice"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert provider.stdout is not None
        ready = json.loads(provider.stdout.readline())
        issuer = ready["issuer"]
        print(f"provider {issuer}; resource {resource}")

        server = MCPServer(
            "oidc-probe",
            token_verifier=JwtVerifier(issuer, ready["jwks_uri"], resource),
            auth=AuthSettings(
                issuer_url=issuer, resource_server_url=resource,
                required_scopes=["manifold:call"], validate_token_resource=True,
            ),
        )

        @server.tool()
        def whoami() -> dict[str, Any]:
            """The caller's token claims."""
            token = get_access_token()
            assert token is not None and token.claims is not None
            return {k: token.claims.get(k) for k in ("sub", "groups", "scope", "aud", "client_id")}

        app = server.streamable_http_app()
        web = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=mcp_port, log_level="warning"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(web.serve)
            while not web.started:
                await anyio.sleep(0.05)

            browser = HeadlessBrowser()
            storage = MemoryStorage()
            auth = OAuthClientProvider(
                server_url=resource,
                client_metadata=OAuthClientMetadata(
                    client_name="sdk-probe", redirect_uris=[REDIRECT_URI],
                    # grant_types defaults to authorization_code + refresh_token
                ),
                storage=storage,
                redirect_handler=browser.redirect_handler,
                callback_handler=browser.callback_handler,
            )
            async with httpx2.AsyncClient(auth=auth, timeout=30) as http:
                async with Client(streamable_http_client(resource, http_client=http)) as client:
                    result = await client.call_tool("whoami", {})
            print("authorization hops:")
            for hop in browser.hops:
                print(f"  {hop[:160]}")
            assert storage.client_info is not None and storage.tokens is not None
            print(f"registered client: {storage.client_info.client_id} "
                  f"({storage.client_info.token_endpoint_auth_method}, scope {storage.client_info.scope!r})")
            print(f"token response: scope={storage.tokens.scope!r} expires_in={storage.tokens.expires_in} "
                  f"refresh_token={'yes' if storage.tokens.refresh_token else 'no'}")
            claims = jwt.decode(storage.tokens.access_token, options={"verify_signature": False})
            print(f"access token claims: {json.dumps(claims)}")
            echoed = result.structured_content or json.loads(result.content[0].text)
            print(f"whoami: {json.dumps(echoed)}")
            assert echoed["sub"] == "alice" and echoed["groups"] == ["engineering"] and echoed["aud"] == resource
            web.should_exit = True
        print("sdk_probe: OK")
    finally:
        provider.terminate()
        provider.wait(timeout=10)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    anyio.run(main)
