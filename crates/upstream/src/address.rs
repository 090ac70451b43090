//! Where a server added at run time may connect. An admin who adds a URL must
//! not reach the gateway's own host or its private network through it, so
//! its host is resolved, every address it resolves to is checked, and the
//! connection goes to the checked address (pinned), never to a second lookup
//! a rebinding name could answer differently. This happens at every connect
//! of such a server (`origin = "runtime"`), the first included, after a
//! reload or a restart too: one check when the server was added says nothing
//! about what the name resolves to later.

use std::{
    future::Future,
    net::{IpAddr, SocketAddr},
    pin::Pin,
};

/// Resolves a host and port to addresses: the system's resolver, or a test's.
pub trait Resolve: Send + Sync {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<SocketAddr>>> + Send + 'a>>;
}

/// The system's resolver (`getaddrinfo`, through tokio).
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<SocketAddr>>> + Send + 'a>> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

/// Why a URL may not be connected to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressRefused {
    /// The URL cannot be used at all.
    #[error("{0}")]
    Invalid(String),
    /// It resolves to an address a runtime server may not reach.
    #[error(
        "{host:?} resolves to {address}, a loopback, private or link-local address; name it in [admin] allowed_hosts to allow it"
    )]
    Private { host: String, address: IpAddr },
}

/// Resolves `url`'s host once with `resolver` and checks every address;
/// returns the address to connect to. A host named in `allowed_hosts` may
/// resolve to any address.
pub async fn check_url(
    url: &str,
    allowed_hosts: &[String],
    resolver: &dyn Resolve,
) -> Result<SocketAddr, AddressRefused> {
    let invalid = |why: String| AddressRefused::Invalid(why);
    let parsed =
        reqwest::Url::parse(url).map_err(|e| invalid(format!("invalid url {url:?}: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(invalid(format!("url {url:?} must be http or https")));
    }
    let host = parsed
        .host_str()
        .ok_or_else(|| invalid(format!("url {url:?} has no host")))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = parsed
        .port_or_known_default()
        .ok_or_else(|| invalid(format!("url {url:?} has no port")))?;
    let named = allowed_hosts.iter().any(|h| h.eq_ignore_ascii_case(&host));
    let addrs = resolver
        .resolve(&host, port)
        .await
        .map_err(|e| invalid(format!("cannot resolve {host:?}: {e}")))?;
    let first = *addrs
        .first()
        .ok_or_else(|| invalid(format!("{host:?} resolves to no address")))?;
    if !named && let Some(bad) = addrs.iter().find(|a| !is_public(a.ip())) {
        return Err(AddressRefused::Private {
            host,
            address: bad.ip(),
        });
    }
    Ok(first)
}

/// Whether an address is one a runtime-added server may reach without being
/// named: not loopback, private, link-local, shared, unspecified, multicast
/// or documentation space.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b)))
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Answers each lookup with the next of its answers: a rebinding name.
    struct Answers(Mutex<Vec<IpAddr>>);

    impl Resolve for Answers {
        fn resolve<'a>(
            &'a self,
            _host: &'a str,
            port: u16,
        ) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<SocketAddr>>> + Send + 'a>> {
            let next = self.0.lock().unwrap().remove(0);
            Box::pin(async move { Ok(vec![SocketAddr::new(next, port)]) })
        }
    }

    #[tokio::test]
    async fn every_check_resolves_again_and_a_private_second_answer_is_refused() {
        let answers = Answers(Mutex::new(vec![
            "93.184.216.34".parse().unwrap(),
            "127.0.0.1".parse().unwrap(),
            "10.0.0.7".parse().unwrap(),
            "169.254.169.254".parse().unwrap(),
        ]));
        let url = "http://rebind.example:8080/mcp";
        assert_eq!(
            check_url(url, &[], &answers).await,
            Ok("93.184.216.34:8080".parse().unwrap())
        );
        for _ in 0..3 {
            assert!(matches!(
                check_url(url, &[], &answers).await,
                Err(AddressRefused::Private { .. })
            ));
        }
    }

    #[tokio::test]
    async fn a_named_host_may_be_private_and_bad_urls_are_refused() {
        let resolver = SystemResolver;
        let allowed = ["localhost".to_string()];
        let addr = check_url("http://localhost:9/mcp", &allowed, &resolver)
            .await
            .unwrap();
        assert!(addr.ip().is_loopback() && addr.port() == 9);
        assert!(matches!(
            check_url("http://localhost:9/mcp", &[], &resolver).await,
            Err(AddressRefused::Private { .. })
        ));
        assert!(matches!(
            check_url("http://[::1]:9/mcp", &[], &resolver).await,
            Err(AddressRefused::Private { .. })
        ));
        for bad in ["ftp://example.com/", "not a url"] {
            assert!(matches!(
                check_url(bad, &[], &resolver).await,
                Err(AddressRefused::Invalid(_))
            ));
        }
    }

    /// The check is the connection's, not only the admin API's: a runtime
    /// server's connect refuses a name that resolves to loopback, whatever
    /// was checked when it was added.
    #[tokio::test]
    async fn a_runtime_server_is_checked_when_it_connects() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!(
            "http://localhost:{}/mcp",
            listener.local_addr().unwrap().port()
        );
        let mut config = crate::UpstreamConfig::http("rt", &url);
        config.origin = crate::ServerOrigin::Runtime;
        config.connect_timeout_ms = 2_000;
        let (events, _keep) = tokio::sync::mpsc::unbounded_channel();
        let upstream = crate::Upstream::new(config, events, Default::default());
        for _ in 0..2 {
            let error = upstream.connect().await.unwrap_err().to_string();
            assert!(error.contains("loopback, private or link-local"), "{error}");
        }
        // Nothing reached the listener: a connection made before the error
        // would be waiting in its queue.
        let accepted = listener.accept().map(|_| ());
        assert_eq!(
            accepted.map_err(|e| e.kind()),
            Err(std::io::ErrorKind::WouldBlock),
            "a connection was made"
        );
    }

    #[test]
    fn private_loopback_and_link_local_are_not_public() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(!is_public(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["93.184.216.34", "2606:2800:220:1::1"] {
            assert!(is_public(ip.parse().unwrap()), "{ip}");
        }
    }
}
