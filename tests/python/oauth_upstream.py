"""An OAuth-protected MCP server for the identity tests: the Python `mcp` SDK's own
resource server, checking RS256 JWT access tokens from tests/npm/oidc/provider.mjs
(PyJWT against the provider's JWKS: iss, aud = this server's /mcp URL, exp).

    python oauth_upstream.py --port P --issuer URL --jwks URL --log FILE

Every accepted call appends one JSON line to --log: the tool, the token's `sub`,
`client_id` and `jti`, so a test can see whose identity reached the upstream.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import anyio
import jwt
import uvicorn
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver.server import MCPServer


class JwtVerifier:
    def __init__(self, issuer: str, jwks_uri: str, audience: str) -> None:
        self.issuer, self.audience = issuer, audience
        self.jwks = jwt.PyJWKClient(jwks_uri, cache_keys=False)

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            key = await anyio.to_thread.run_sync(self.jwks.get_signing_key_from_jwt, token)
            claims = jwt.decode(token, key.key, algorithms=["RS256"], audience=self.audience,
                                issuer=self.issuer, options={"require": ["exp", "sub", "aud", "iss"]})
        except jwt.PyJWTError:
            return None
        return AccessToken(token=token, client_id=claims.get("client_id", ""),
                           scopes=claims.get("scope", "").split(), expires_at=claims["exp"],
                           resource=claims["aud"], subject=claims["sub"], claims=claims)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--issuer", required=True)
    parser.add_argument("--jwks", required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    resource = f"http://127.0.0.1:{args.port}/mcp"
    server = MCPServer(
        "tracker",
        token_verifier=JwtVerifier(args.issuer, args.jwks, resource),
        auth=AuthSettings(issuer_url=args.issuer, resource_server_url=resource, required_scopes=[]),
    )

    @server.tool()
    def whoami() -> dict[str, Any]:
        """Who the caller's access token says it is."""
        token = get_access_token()
        assert token is not None and token.claims is not None
        seen = {k: token.claims.get(k) for k in ("sub", "client_id", "jti", "exp")}
        with open(args.log, "a") as log:
            log.write(json.dumps({"tool": "whoami", "at": time.time(), **seen}) + "\n")
        return {"sub": seen["sub"], "client_id": seen["client_id"]}

    app = server.streamable_http_app()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
