//! The connections of a `credentials = "per_principal"` server: one per
//! caller, each carrying that caller's own OAuth token, so the upstream sees
//! who really acts and no caller borrows another's access.
//!
//! A caller's connection opens on its first request (from the token it keeps
//! in the vault), closes after `principal_idle_seconds` without a request,
//! and at most `max_principal_connections` are open: the least recently used
//! makes way. A closing connection finishes the calls it already has. A lost
//! connection is not restarted: the caller's next request opens another.
//! A caller without a token, or whose token the upstream refuses, is sent
//! to sign in.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, Weak},
    time::{Duration, Instant},
};

use tokio::sync::mpsc;

use super::open::Connection;
use crate::{UpstreamConfig, UpstreamError, UpstreamEvent, oauth::OAuthClient};

/// How long a started sign-in's URL is handed out again, instead of a new
/// one per request (the store keeps a pending sign-in for 10 minutes).
const SIGN_IN_REUSE: Duration = Duration::from_secs(300);

pub(super) struct Principals {
    config: Arc<UpstreamConfig>,
    events: mpsc::UnboundedSender<UpstreamEvent>,
    oauth: OAuthClient,
    members: Arc<Mutex<Members>>,
}

#[derive(Default)]
struct Members {
    open: HashMap<String, Member>,
    /// Sign-in URLs handed out, per principal, and when.
    sign_ins: HashMap<String, (String, Instant)>,
    sweeping: bool,
}

struct Member {
    connection: Arc<Connection>,
    used: Instant,
}

impl Principals {
    pub(super) fn new(
        config: &Arc<UpstreamConfig>,
        events: &mpsc::UnboundedSender<UpstreamEvent>,
        oauth: &OAuthClient,
    ) -> Self {
        Self {
            config: Arc::clone(config),
            events: events.clone(),
            oauth: oauth.clone(),
            members: Arc::default(),
        }
    }

    /// The connection `principal`'s requests go over: its own, opened from
    /// the token the vault keeps for it. A principal with no token gets
    /// `auth_required` with a sign-in URL of its own.
    ///
    /// Only a request the broker has already allowed starts a sign-in
    /// (`start_sign_in`); a listing just says one is needed.
    pub(super) async fn member(
        &self,
        principal: Option<&str>,
        start_sign_in: bool,
    ) -> Result<Arc<Connection>, UpstreamError> {
        let server = &self.config.name;
        let Some(principal) = principal.filter(|p| !p.is_empty()) else {
            return Err(UpstreamError::AuthRequired {
                server: server.clone(),
                hint: "acts with each caller's own credentials, and this request names no caller"
                    .into(),
            });
        };
        if let Some(member) = self.get(principal)
            && member.is_open().await
        {
            return Ok(member);
        }
        // Only a principal with a token takes one of the capped connections.
        let kept = match self.oauth.vault() {
            Some(vault) => {
                vault
                    .load(server, principal)
                    .await
                    .map_err(|e| UpstreamError::Connect {
                        server: server.clone(),
                        reason: e,
                    })?
            }
            None => None,
        };
        // `None`: the principal must sign in (again).
        let failure = match kept {
            None => None,
            Some(_) => {
                let member = self.get_or_insert(principal);
                match self.open(&member, principal).await {
                    Ok(()) => return Ok(member),
                    Err(error) => {
                        self.close(principal, &member);
                        (!member.needs_sign_in()).then_some(error)
                    }
                }
            }
        };
        Err(match failure {
            Some(error) => error,
            None if start_sign_in => self.sign_in_needed(principal).await,
            None => self.sign_in_pending(principal),
        })
    }

    /// Opens `member` as `principal` unless it is open.
    async fn open(&self, member: &Connection, principal: &str) -> Result<(), UpstreamError> {
        let Some(mut slot) = member.vacant().await else {
            return Ok(());
        };
        let live = member
            .open(Some(principal), &self.events, &self.oauth)
            .await?;
        *slot = Some(live);
        Ok(())
    }

    /// A member's answer as the caller should see it: a refused token means
    /// that caller must sign in again.
    pub(super) async fn answer<T>(
        &self,
        principal: Option<&str>,
        member: &Arc<Connection>,
        result: Result<T, UpstreamError>,
        start_sign_in: bool,
    ) -> Result<T, UpstreamError> {
        match (result, principal) {
            (Err(UpstreamError::AuthRequired { .. }), Some(principal)) => {
                self.close(principal, member);
                Err(if start_sign_in {
                    self.sign_in_needed(principal).await
                } else {
                    self.sign_in_pending(principal)
                })
            }
            (result, _) => result,
        }
    }

    /// `auth_required` without starting a sign-in: the URL `principal` was
    /// given, if any, else how to get one.
    fn sign_in_pending(&self, principal: &str) -> UpstreamError {
        let server = &self.config.name;
        let hint = match self.sign_in_url(principal) {
            Some(url) => format!("needs {principal} to sign in: open {url}"),
            None => format!(
                "needs {principal} to sign in: call one of its tools, or enable_server {server}, for the sign-in URL"
            ),
        };
        UpstreamError::AuthRequired {
            server: server.clone(),
            hint,
        }
    }

    /// `auth_required`, with the URL where `principal` signs in (one per
    /// principal, handed out again for a few minutes).
    pub(super) async fn sign_in_needed(&self, principal: &str) -> UpstreamError {
        let server = self.config.name.clone();
        let url = match self.sign_in_url(principal) {
            Some(url) => url,
            None => {
                let Some(callback) = self.oauth.callback_url() else {
                    return UpstreamError::AuthRequired {
                        server,
                        hint: format!(
                            "needs {principal} to sign in, and the gateway has no [gateway] public_url for the sign-in to return to"
                        ),
                    };
                };
                match self
                    .oauth
                    .begin_sign_in(&self.config, principal, callback)
                    .await
                {
                    // The caller is sent to the gateway's page, which
                    // checks who opens it, never straight to the
                    // authorization server.
                    Ok((_, authorize_url)) => match self.oauth.sign_in_page(&authorize_url) {
                        Some(url) => {
                            self.remember_sign_in(principal, &url);
                            url
                        }
                        None => {
                            return UpstreamError::AuthRequired {
                                server,
                                hint: format!(
                                    "needs {principal} to sign in, and the gateway has no sign-in page to send it to"
                                ),
                            };
                        }
                    },
                    Err(error) => {
                        return UpstreamError::AuthRequired {
                            server,
                            hint: format!(
                                "needs {principal} to sign in, and starting the sign-in failed: {error}"
                            ),
                        };
                    }
                }
            }
        };
        UpstreamError::AuthRequired {
            server,
            hint: format!("needs {principal} to sign in: open {url}"),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Members> {
        self.members.lock().expect("principals lock")
    }

    /// `principal`'s connection, if it has one, marked used now.
    fn get(&self, principal: &str) -> Option<Arc<Connection>> {
        let mut members = self.lock();
        let member = members.open.get_mut(principal)?;
        member.used = Instant::now();
        Some(Arc::clone(&member.connection))
    }

    /// `principal`'s connection, marked used now; a new one (not yet open)
    /// when it has none.
    fn get_or_insert(&self, principal: &str) -> Arc<Connection> {
        let now = Instant::now();
        let mut members = self.lock();
        if let Some(member) = members.open.get_mut(principal) {
            member.used = now;
            return Arc::clone(&member.connection);
        }
        if members.open.len() >= self.config.max_principal_connections {
            let oldest = members
                .open
                .iter()
                .min_by_key(|(_, m)| m.used)
                .map(|(p, _)| p.clone());
            if let Some(member) = oldest.and_then(|p| members.open.remove(&p)) {
                retire_later(member.connection);
            }
        }
        let connection = Arc::new(Connection::new(&self.config));
        members.open.insert(
            principal.to_string(),
            Member {
                connection: Arc::clone(&connection),
                used: now,
            },
        );
        if !members.sweeping {
            members.sweeping = true;
            let idle = Duration::from_secs(self.config.principal_idle_seconds);
            tokio::spawn(sweep(Arc::downgrade(&self.members), idle));
        }
        connection
    }

    /// Closes `principal`'s connection if it is still `connection`.
    fn close(&self, principal: &str, connection: &Arc<Connection>) {
        let mut members = self.lock();
        if members
            .open
            .get(principal)
            .is_some_and(|m| Arc::ptr_eq(&m.connection, connection))
            && let Some(member) = members.open.remove(principal)
        {
            retire_later(member.connection);
        }
    }

    /// Closes `principal`'s connection, whatever it is.
    pub(super) fn close_principal(&self, principal: &str) {
        if let Some(member) = self.lock().open.remove(principal) {
            retire_later(member.connection);
        }
    }

    pub(super) fn close_all(&self) {
        let members: Vec<_> = self.lock().open.drain().collect();
        for (_, member) in members {
            retire_later(member.connection);
        }
    }

    pub(super) fn count(&self) -> usize {
        self.lock().open.len()
    }

    /// The sign-in URL `principal` was given recently, if any.
    pub(super) fn sign_in_url(&self, principal: &str) -> Option<String> {
        let mut members = self.lock();
        members
            .sign_ins
            .retain(|_, (_, at)| at.elapsed() < SIGN_IN_REUSE);
        members.sign_ins.get(principal).map(|(url, _)| url.clone())
    }

    fn remember_sign_in(&self, principal: &str, url: &str) {
        self.lock()
            .sign_ins
            .insert(principal.to_string(), (url.to_string(), Instant::now()));
    }

    pub(super) fn forget_sign_in(&self, principal: &str) {
        self.lock().sign_ins.remove(principal);
    }
}

/// Closes `connection` once its calls in flight are done (at most the call
/// timeout).
fn retire_later(connection: Arc<Connection>) {
    let timeout = Duration::from_millis(connection.config.call_timeout_ms);
    tokio::spawn(async move {
        connection.drain(timeout).await;
        connection.close().await;
    });
}

/// Closes connections idle for `idle`, until the server is gone.
async fn sweep(members: Weak<Mutex<Members>>, idle: Duration) {
    let every = (idle / 4).clamp(Duration::from_millis(250), Duration::from_secs(30));
    loop {
        tokio::time::sleep(every).await;
        let Some(members) = members.upgrade() else {
            return;
        };
        let idle_ones: Vec<_> = {
            let mut members = members.lock().expect("principals lock");
            let idle_principals: Vec<String> = members
                .open
                .iter()
                .filter(|(_, m)| m.used.elapsed() >= idle)
                .map(|(p, _)| p.clone())
                .collect();
            idle_principals
                .iter()
                .filter_map(|p| members.open.remove(p))
                .collect()
        };
        for member in idle_ones {
            tracing::debug!(server = %member.connection.config.name, "closing an idle per-principal connection");
            retire_later(member.connection);
        }
    }
}
