//! The floor one HTTP hop can reach on this machine: nginx as a plain
//! reverse proxy in front of the same upstream, measured in the same run as
//! the gateway by `manifold-bench call`.
//!
//! The targets for a governed call (added p50, throughput against direct)
//! were set on another machine, where nginx's hop added 34–62 µs. On a
//! virtual machine whose thread wake-ups cost more, every hop costs more;
//! this row says how much a hop with no MCP logic at all costs here.

use std::{
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context, bail};

/// nginx on `PATH` (or in `/usr/sbin`, which a non-root `PATH` may lack).
pub fn find_nginx() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("nginx"))
        .find(|candidate| candidate.is_file())
}

/// A running nginx; stopped when dropped.
pub struct Nginx {
    child: tokio::process::Child,
    pub url: String,
}

impl Nginx {
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

/// Starts `nginx` as one process (no master, one worker: its CPU is one
/// `/proc` entry) proxying `upstream_url` with keep-alive connections, as
/// the issue's reference hop did. The caller's `Host` goes through as it
/// is: the upstream refuses a host it does not know (DNS rebinding), and
/// nginx would send the upstream block's name. Its files live in `dir`.
pub async fn start(nginx: &Path, dir: &Path, upstream_url: &str) -> anyhow::Result<Nginx> {
    let upstream = reqwest::Url::parse(upstream_url)?;
    let (host, port) = (
        upstream.host_str().context("upstream host")?,
        upstream.port_or_known_default().context("upstream port")?,
    );
    let root = dir.join("nginx");
    std::fs::create_dir_all(root.join("tmp"))?;
    // nginx cannot listen on port 0 and say which port it got; a port the
    // kernel just gave out and took back is free unless something races.
    let listen = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let config = render_config(&root, host, port, listen);
    std::fs::write(root.join(CONFIG), config)?;
    let child = tokio::process::Command::from(nginx_in(nginx, &root))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", nginx.display()))?;
    let url = format!("http://{listen}{}", upstream.path());
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(listen).await.is_ok() {
            return Ok(Nginx { child, url });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = std::fs::read_to_string(root.join("error.log")).unwrap_or_default();
    bail!("nginx did not listen on {listen} within 5 s: {log}")
}

/// The configuration's file name under nginx's `root`.
const CONFIG: &str = "nginx.conf";

/// `nginx` with `root` as its prefix and the home of its configuration and
/// error log (nothing under `/etc` or `/var/log`).
fn nginx_in(nginx: &Path, root: &Path) -> std::process::Command {
    let mut command = std::process::Command::new(nginx);
    command
        .arg("-p")
        .arg(root)
        .arg("-e")
        .arg(root.join("error.log"))
        .arg("-c")
        .arg(root.join(CONFIG));
    command
}

/// nginx's configuration: files under `root`, `listen` proxied to
/// `host:port` over keep-alive connections.
fn render_config(root: &Path, host: &str, port: u16, listen: SocketAddr) -> String {
    format!(
        r#"daemon off;
master_process off;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {root}/tmp;
  proxy_temp_path {root}/tmp;
  fastcgi_temp_path {root}/tmp;
  uwsgi_temp_path {root}/tmp;
  scgi_temp_path {root}/tmp;
  upstream mcp {{ server {host}:{port}; keepalive 64; }}
  server {{
    listen {listen};
    location / {{
      proxy_pass http://mcp;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $http_host;
    }}
  }}
}}
"#,
        root = root.display(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rendered configuration is one nginx accepts (`nginx -t`), where
    /// nginx is installed; its keep-alive and `Host` lines are there either way.
    #[test]
    fn the_configuration_is_one_nginx_accepts() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("nginx");
        std::fs::create_dir_all(root.join("tmp")).unwrap();
        let config = render_config(&root, "127.0.0.1", 9, "127.0.0.1:9".parse().unwrap());
        assert!(config.contains("keepalive 64;"), "{config}");
        assert!(
            config.contains("proxy_set_header Host $http_host;"),
            "{config}"
        );
        assert!(
            config.contains("proxy_set_header Connection \"\";"),
            "{config}"
        );
        assert_eq!(config.matches('{').count(), config.matches('}').count());
        let Some(nginx) = find_nginx() else { return };
        std::fs::write(root.join(CONFIG), &config).unwrap();
        let checked = nginx_in(&nginx, &root).arg("-t").output().unwrap();
        assert!(
            checked.status.success(),
            "{}\n{config}",
            String::from_utf8_lossy(&checked.stderr)
        );
    }
}
