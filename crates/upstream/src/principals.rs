//! The connections of a `credentials = "per_principal"` server: one per
//! caller, each carrying that caller's own OAuth token, so the upstream sees
//! who really acts and no caller borrows another's access.
//!
//! A caller's connection opens on its first request (from the token it keeps
//! in the vault), closes after `principal_idle_seconds` without a request,
//! and at most `max_principal_connections` are open: the least recently used
//! makes way. A closing connection finishes the calls it already has.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, Weak},
    time::{Duration, Instant},
};

use crate::{Upstream, UpstreamConfig};

/// How long a started sign-in's URL is handed out again, instead of a new
/// one per request (the store keeps a pending sign-in for 10 minutes).
const SIGN_IN_REUSE: Duration = Duration::from_secs(300);

#[derive(Default)]
pub(crate) struct Principals {
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
    upstream: Arc<Upstream>,
    used: Instant,
}

impl Principals {
    fn lock(&self) -> MutexGuard<'_, Members> {
        self.members.lock().expect("principals lock")
    }

    /// `principal`'s connection, if it has one, marked used now.
    pub(crate) fn get(&self, principal: &str) -> Option<Arc<Upstream>> {
        let mut members = self.lock();
        let member = members.open.get_mut(principal)?;
        member.used = Instant::now();
        Some(Arc::clone(&member.upstream))
    }

    /// `principal`'s connection, marked used now; `open` makes one (not yet
    /// connected) when it has none.
    pub(crate) fn get_or_insert(
        &self,
        principal: &str,
        config: &UpstreamConfig,
        open: impl FnOnce() -> Arc<Upstream>,
    ) -> Arc<Upstream> {
        let now = Instant::now();
        let mut members = self.lock();
        if let Some(member) = members.open.get_mut(principal) {
            member.used = now;
            return Arc::clone(&member.upstream);
        }
        if members.open.len() >= config.max_principal_connections {
            let oldest = members
                .open
                .iter()
                .min_by_key(|(_, m)| m.used)
                .map(|(p, _)| p.clone());
            if let Some(member) = oldest.and_then(|p| members.open.remove(&p)) {
                retire_later(member.upstream);
            }
        }
        let upstream = open();
        members.open.insert(
            principal.to_string(),
            Member {
                upstream: Arc::clone(&upstream),
                used: now,
            },
        );
        if !members.sweeping {
            members.sweeping = true;
            let idle = Duration::from_secs(config.principal_idle_seconds);
            tokio::spawn(sweep(Arc::downgrade(&self.members), idle));
        }
        upstream
    }

    /// Closes `principal`'s connection if it is still `upstream`.
    pub(crate) fn close(&self, principal: &str, upstream: &Arc<Upstream>) {
        let mut members = self.lock();
        if members
            .open
            .get(principal)
            .is_some_and(|m| Arc::ptr_eq(&m.upstream, upstream))
            && let Some(member) = members.open.remove(principal)
        {
            retire_later(member.upstream);
        }
    }

    /// Closes `principal`'s connection, whatever it is.
    pub(crate) fn close_principal(&self, principal: &str) {
        if let Some(member) = self.lock().open.remove(principal) {
            retire_later(member.upstream);
        }
    }

    pub(crate) fn close_all(&self) {
        let members: Vec<_> = self.lock().open.drain().collect();
        for (_, member) in members {
            retire_later(member.upstream);
        }
    }

    pub(crate) fn count(&self) -> usize {
        self.lock().open.len()
    }

    /// The sign-in URL `principal` was given recently, if any.
    pub(crate) fn sign_in_url(&self, principal: &str) -> Option<String> {
        let mut members = self.lock();
        members
            .sign_ins
            .retain(|_, (_, at)| at.elapsed() < SIGN_IN_REUSE);
        members.sign_ins.get(principal).map(|(url, _)| url.clone())
    }

    pub(crate) fn remember_sign_in(&self, principal: &str, url: &str) {
        self.lock()
            .sign_ins
            .insert(principal.to_string(), (url.to_string(), Instant::now()));
    }

    pub(crate) fn forget_sign_in(&self, principal: &str) {
        self.lock().sign_ins.remove(principal);
    }
}

/// Closes `upstream` once its calls in flight are done (at most its call
/// timeout).
fn retire_later(upstream: Arc<Upstream>) {
    let timeout = Duration::from_millis(upstream.config().call_timeout_ms);
    tokio::spawn(async move { upstream.retire(timeout).await });
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
            tracing::debug!(server = %member.upstream.name(), "closing an idle per-principal connection");
            retire_later(member.upstream);
        }
    }
}
