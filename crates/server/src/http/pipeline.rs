//! `/mcp` as one layer, in order: the DNS-rebinding and size checks
//! (`guard.rs`), with the body limited to `max_body_bytes` as it is read;
//! who is calling (`auth.rs`), the body read
//! and parsed once and tracked (`requests.rs`), the identity provider's
//! step-up (`auth.rs`), admission of discovery (`admission.rs`), then a plain
//! call answered here (`fast_call.rs`) or anything else handed to rmcp.
//!
//! One layer of plain functions rather than one axum layer each: every
//! layer boxed its future and cloned the chain behind it on each request.

use std::sync::Arc;

use axum::{
    body::Body,
    extract::{Request, State},
    middleware::Next,
    response::Response,
};

use super::{
    admission::{self, AdmissionState},
    auth::{self, AuthState, StepUpState},
    fast_call,
    guard::{self, Guard},
    requests::{self, Requests},
};
use crate::GatewayState;

#[derive(Clone)]
pub(crate) struct Pipeline {
    pub guard: Arc<Guard>,
    pub auth: AuthState,
    pub requests: Arc<Requests>,
    pub step_up: StepUpState,
    pub admission: AdmissionState,
    /// Set when plain calls are answered without rmcp.
    pub fast_calls: Option<Arc<GatewayState>>,
}

pub(crate) async fn mcp(
    State(pipeline): State<Arc<Pipeline>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(refused) = guard::refusal(&pipeline.guard, &request) {
        return refused;
    }
    // A body without a declared length is cut off at the limit while read.
    let limit = pipeline.guard.max_body_bytes;
    let mut request = request.map(|body| Body::new(http_body_util::Limited::new(body, limit)));
    // `_rows` lives until the answer, so the access row is committed with
    // the request's own rows (`AuditWriter::begin_request`).
    let (caller, _rows) = match auth::caller_of(&pipeline.auth, request.headers()).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    request.extensions_mut().insert(caller);
    let (request, in_flight) = match requests::read(&pipeline.requests, request).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let response = answer(&pipeline, request, next).await;
    requests::finish(in_flight, response)
}

async fn answer(pipeline: &Pipeline, request: Request, next: Next) -> Response {
    if let Some(refused) = auth::step_up_refusal(&pipeline.step_up, &request) {
        return refused;
    }
    let parsed = request.extensions().get::<requests::Parsed>();
    let _admitted = match admission::admit_discovery(&pipeline.admission, parsed).await {
        Ok(admitted) => admitted,
        Err(busy) => return busy,
    };
    let request = match &pipeline.fast_calls {
        Some(state) => match fast_call::answer(state, request).await {
            Ok(answered) => return answered,
            Err(request) => request,
        },
        None => request,
    };
    next.run(request).await
}
