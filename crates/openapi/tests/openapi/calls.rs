//! Calls over real HTTP to a small axum service: results by content type,
//! errors with an excerpt, and the limits (size, time, redirects, cookies).

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Router,
    http::{HeaderMap, StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use manifold_openapi::{CallError, ClientCredentials, HttpClient, Operation, Target};
use reqwest::Url;
use serde_json::{Map, json};

use super::{document, parse};

/// Cookies the service saw, one entry per request.
type Seen = Arc<Mutex<Vec<Option<String>>>>;

async fn serve(seen: Seen) -> Url {
    let cookies = move |headers: HeaderMap| {
        let seen = Arc::clone(&seen);
        async move {
            let cookie = headers
                .get(header::COOKIE)
                .map(|v| v.to_str().unwrap().to_string());
            seen.lock().unwrap().push(cookie);
            (
                [(header::SET_COOKIE, "session=abc")],
                axum::Json(json!({ "ok": true })),
            )
        }
    };
    let router = Router::new()
        .route(
            "/json",
            get(|| async { axum::Json(json!({ "pets": [1, 2] })) }),
        )
        .route("/list", get(|| async { axum::Json(json!([1, 2])) }))
        .route("/text", get(|| async { "plain words" }))
        .route("/empty", get(|| async { StatusCode::NO_CONTENT }))
        .route(
            "/missing",
            get(|| async { (StatusCode::NOT_FOUND, "x".repeat(5000)) }),
        )
        .route(
            "/redirect",
            get(|| async { axum::response::Redirect::temporary("/json").into_response() }),
        )
        .route("/large", get(|| async { "y".repeat(100_000) }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "late"
            }),
        )
        .route("/cookie", get(cookies));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    Url::parse(&format!("http://{address}/")).unwrap()
}

fn operation(path: &str) -> Operation {
    let doc = document(json!({ path: { "get": {} } }), json!({}));
    parse(&doc).operations.remove(0)
}

async fn call(
    base: &Url,
    path: &str,
    max_bytes: usize,
    timeout: Duration,
) -> Result<manifold_openapi::Outcome, CallError> {
    let target = Target {
        base: base.clone(),
        headers: Default::default(),
        query: Vec::new(),
    };
    let request = operation(path).prepare(&target, &Map::new()).unwrap();
    let client = HttpClient::new(Duration::from_secs(5)).unwrap();
    client.send(request, timeout, max_bytes).await
}

const SECOND: Duration = Duration::from_secs(10);

#[tokio::test]
async fn answers_become_results_by_their_type_and_status() {
    let base = serve(Seen::default()).await;
    let json = call(&base, "/json", 1 << 20, SECOND).await.unwrap();
    assert!(!json.is_error);
    assert_eq!(json.text, r#"{"pets":[1,2]}"#);
    assert_eq!(json!(json.structured), json!({ "pets": [1, 2] }));
    let list = call(&base, "/list", 1 << 20, SECOND).await.unwrap();
    assert_eq!((list.text.as_str(), list.structured), ("[1,2]", None));
    let text = call(&base, "/text", 1 << 20, SECOND).await.unwrap();
    assert_eq!((text.text.as_str(), text.structured), ("plain words", None));
    let empty = call(&base, "/empty", 1 << 20, SECOND).await.unwrap();
    assert_eq!(empty.text, "HTTP 204 No Content, no content");
    let missing = call(&base, "/missing", 1 << 20, SECOND).await.unwrap();
    assert!(missing.is_error);
    assert!(
        missing.text.starts_with("HTTP 404 Not Found: xxx"),
        "{}",
        missing.text
    );
    assert!(missing.text.ends_with(" [cut]"));
    assert!(missing.text.len() < 2100, "{}", missing.text.len());
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let base = serve(Seen::default()).await;
    let redirect = call(&base, "/redirect", 1 << 20, SECOND).await.unwrap();
    assert!(redirect.is_error);
    assert!(redirect.text.starts_with("HTTP 307"), "{}", redirect.text);
}

#[tokio::test]
async fn a_response_over_the_limit_or_too_slow_is_an_error() {
    let base = serve(Seen::default()).await;
    let large = call(&base, "/large", 10_000, SECOND).await.unwrap_err();
    assert!(
        matches!(large, CallError::TooLarge { limit: 10_000, .. }),
        "{large:?}"
    );
    assert!(call(&base, "/large", 200_000, SECOND).await.is_ok());
    let slow = call(&base, "/slow", 1 << 20, Duration::from_millis(200))
        .await
        .unwrap_err();
    assert_eq!(slow, CallError::Timeout { timeout_ms: 200 });
}

/// The service sets a cookie on every answer; no request carries it back.
#[tokio::test]
async fn no_cookie_is_kept_between_calls() {
    let seen = Seen::default();
    let base = serve(Arc::clone(&seen)).await;
    let target = Target {
        base,
        headers: Default::default(),
        query: Vec::new(),
    };
    let client = HttpClient::new(Duration::from_secs(5)).unwrap();
    for _ in 0..2 {
        let request = operation("/cookie").prepare(&target, &Map::new()).unwrap();
        assert!(
            !client
                .send(request, SECOND, 1 << 20)
                .await
                .unwrap()
                .is_error
        );
    }
    assert_eq!(*seen.lock().unwrap(), [None, None]);
}

/// A token endpoint that checks the client's credentials and the grant,
/// and counts the tokens it issued ("t1", "t2", ...).
async fn token_endpoint(issued: Arc<Mutex<u32>>) -> Url {
    let token = move |headers: HeaderMap, body: String| {
        let issued = Arc::clone(&issued);
        async move {
            // "gateway:s3cret" in base64.
            let basic = headers
                .get(header::AUTHORIZATION)
                .unwrap()
                .to_str()
                .unwrap();
            if basic != "Basic Z2F0ZXdheTpzM2NyZXQ=" {
                return (
                    StatusCode::UNAUTHORIZED,
                    axum::Json(json!({ "error": "invalid_client" })),
                );
            }
            assert_eq!(
                body,
                "grant_type=client_credentials&scope=pets%3Aread+pets%3Awrite"
            );
            let mut issued = issued.lock().unwrap();
            *issued += 1;
            let answer = json!({ "access_token": format!("t{issued}"), "token_type": "Bearer", "expires_in": 3600 });
            (StatusCode::OK, axum::Json(answer))
        }
    };
    let router = Router::new().route("/token", axum::routing::post(token));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    Url::parse(&format!("http://{address}/token")).unwrap()
}

#[tokio::test]
async fn a_client_credentials_token_is_fetched_once_and_again_when_forgotten() {
    let issued = Arc::new(Mutex::new(0));
    let url = token_endpoint(Arc::clone(&issued)).await;
    let client = HttpClient::new(Duration::from_secs(5)).unwrap();
    let scopes = vec!["pets:read".to_string(), "pets:write".to_string()];
    let grant = ClientCredentials::new(
        url.clone(),
        "gateway".into(),
        "s3cret".into(),
        scopes.clone(),
    );
    assert_eq!(grant.token(&client, SECOND).await.unwrap(), "t1");
    assert_eq!(grant.token(&client, SECOND).await.unwrap(), "t1");
    grant.forget().await;
    assert_eq!(grant.token(&client, SECOND).await.unwrap(), "t2");
    assert_eq!(*issued.lock().unwrap(), 2);
    let wrong = ClientCredentials::new(url, "gateway".into(), "wrong".into(), scopes);
    let error = wrong.token(&client, SECOND).await.unwrap_err();
    assert_eq!(error, "the token endpoint answered HTTP 401 Unauthorized");
}

#[test]
fn the_client_credentials_token_url_comes_from_the_security_schemes() {
    let mut doc = document(json!({}), json!({}));
    doc["components"]["securitySchemes"] = json!({
        "key": { "type": "apiKey", "in": "header", "name": "X-Key" },
        "oauth": { "type": "oauth2", "flows": {
            "authorizationCode": { "authorizationUrl": "https://a/auth", "tokenUrl": "https://a/code-token" },
            "clientCredentials": { "tokenUrl": "https://a/token", "scopes": {} } } },
    });
    assert_eq!(
        parse(&doc).client_credentials_token_url.as_deref(),
        Some("https://a/token")
    );
    assert_eq!(
        parse(&document(json!({}), json!({}))).client_credentials_token_url,
        None
    );
}
