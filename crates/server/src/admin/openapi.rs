//! The admin API's OpenAPI 3.1 document, generated from the handlers'
//! annotations, so it cannot drift from the routes it describes. Served at
//! `/admin/openapi.json` without a token.

use axum::{Json, Router, routing::get};
use utoipa::{
    Modify, OpenApi,
    openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme},
};

use super::*;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Manifold admin API",
        description = "Servers, catalog, search, tokens, policies, approvals and audit of a \
                       Manifold gateway. Every route but this document needs a gateway token \
                       with the `admin` action."
    ),
    paths(
        overview, list_servers, add_server, get_server, remove_server, enable_server, disable_server,
        sign_in_server,
        list_tools, get_tool, approve_tool, quarantine_tool, classify_tool,
        search,
        list_tokens, create_token, revoke_token,
        list_policies, create_policy, update_policy, delete_policy,
        list_approvals, approval_events, approve, deny,
        audit, audit_export,
    ),
    components(schemas(ops::AuditRow)),
    modifiers(&Security),
    security(("bearer" = []), ("console_cookie" = [])),
)]
struct AdminApi;

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        components.add_security_scheme(
            "console_cookie",
            // `__Host-manifold_console` when served over https.
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::new("manifold_console"))),
        );
    }
}

/// The document served at `/admin/openapi.json`.
pub fn openapi_document() -> utoipa::openapi::OpenApi {
    AdminApi::openapi()
}

pub(crate) fn routes() -> Router {
    Router::new().route(
        "/admin/openapi.json",
        get(|| async { Json(openapi_document()) }),
    )
}
