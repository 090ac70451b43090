//! `/healthz` and `/readyz`, for load balancers and orchestrators. Both are
//! unauthenticated and say nothing about callers or tools.

use std::{sync::Arc, time::Duration};

use axum::{Json, Router, extract::State, http::StatusCode, routing::get};
use serde_json::{Value, json};

use crate::GatewayState;

/// A store that takes longer than this to answer `SELECT 1` is not ready.
const STORE_TIMEOUT: Duration = Duration::from_secs(2);

pub fn routes(state: Arc<GatewayState>) -> Router {
    Router::new()
        .route(
            "/healthz",
            get(|| async { Json(json!({ "status": "alive" })) }),
        )
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn readyz(State(state): State<Arc<GatewayState>>) -> (StatusCode, Json<Value>) {
    match readiness(&state).await {
        Ok(()) => (StatusCode::OK, Json(json!({ "status": "ready" }))),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "not_ready", "reason": reason })),
        ),
    }
}

/// Ready when the catalog has finished its first load, the store answers,
/// and audit rows can be made durable (else calls are refused).
pub async fn readiness(state: &GatewayState) -> Result<(), String> {
    if !state.is_ready() {
        return Err("the catalog has not finished its first load".into());
    }
    if state.governance().audit_unavailable() {
        return Err(format!(
            "audit rows cannot be made durable: calls are answered {}",
            manifold_broker::AuditUnavailable::CODE
        ));
    }
    match tokio::time::timeout(STORE_TIMEOUT, state.governance().store().ping()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(format!("the store does not answer: {error}")),
        Err(_) => Err(format!(
            "the store did not answer within {} ms",
            STORE_TIMEOUT.as_millis()
        )),
    }
}

#[cfg(test)]
mod tests {
    use manifold_broker::Governance;
    use manifold_catalog::ToolCatalog;
    use manifold_store::Store;

    use super::*;
    use crate::GatewayParts;

    #[tokio::test]
    async fn ready_only_after_the_first_load_and_while_the_store_answers() {
        let store = Store::connect("sqlite::memory:").await.unwrap();
        let state = GatewayState::new(GatewayParts::new(
            ToolCatalog::new(Vec::new(), true),
            Governance::new(store.clone(), Default::default()),
        ));
        let reason = readiness(&state).await.unwrap_err();
        assert!(reason.contains("first load"), "{reason}");
        state.mark_ready();
        readiness(&state).await.unwrap();
        store.close().await;
        let reason = readiness(&state).await.unwrap_err();
        assert!(reason.contains("store"), "{reason}");
    }
}
