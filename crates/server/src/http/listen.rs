//! The HTTP server loop: accept a connection, serve it as a task of its
//! own, and on the stop signal stop accepting and let the connections
//! finish. axum's `serve` does the same; this one wraps each connection's
//! task in [`manifold_wake::self_wakes`]. Reading a request's body wakes
//! the connection's own task (the body tells the connection it wants
//! data), and tokio reschedules a task woken while it runs as a yield,
//! waking another worker thread for it: once per request, for nothing.

use std::{future::Future, time::Duration};

use axum::{Router, body::Body};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::{conn::auto, graceful::GracefulShutdown},
    service::TowerToHyperService,
};
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;

/// Serves `app` on `listener` until `stop` resolves, then waits for the
/// open connections: each ends after its request in flight, if any.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    stop: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let connections = GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let stream = tokio::select! {
            stream = accept(&listener) => stream,
            () = &mut stop => break,
        };
        // Replies go out whole; Nagle's delay would only hold the last segment.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "TCP_NODELAY not set");
        }
        let service = TowerToHyperService::new(
            app.clone()
                .map_request(|request: hyper::Request<Incoming>| request.map(Body::new)),
        );
        let connection = auto::Builder::new(TokioExecutor::new())
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let connection = connections.watch(connection);
        tokio::spawn(manifold_wake::self_wakes(async move {
            if let Err(error) = connection.await {
                tracing::trace!(%error, "connection ended with an error");
            }
        }));
    }
    drop(listener);
    connections.shutdown().await;
    Ok(())
}

/// The next connection. A failed accept that is the peer's doing (reset
/// before we took it) is skipped; another (out of file descriptors) is
/// logged and retried after a second, as axum's loop does.
async fn accept(listener: &TcpListener) -> TcpStream {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => return stream,
            Err(error) if is_peer_error(&error) => {}
            Err(error) => {
                tracing::error!(%error, "accept failed; retrying in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

fn is_peer_error(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        error.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    )
}
