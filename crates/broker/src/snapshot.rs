//! The governance snapshot: tokens, groups, policies and classifications as
//! the store had them, kept in memory until governance changes.
//!
//! A snapshot belongs to one *epoch*: this store's own governance writes
//! plus the changes heard from other processes. Every decision starts by
//! asking for the current snapshot; when the epoch moved, it gets a new,
//! empty one, whose entries load from the store on first use. So:
//! - a write made in this process applies to the next request at once (the
//!   store counts it when it commits);
//! - a write from another process on the same SQLite file (the CLI) is seen
//!   by the generation watch within [`SQLITE_WATCH`] plus one read;
//! - on PostgreSQL the database's trigger notifies every replica at commit
//!   (`StoreEvent::GovernanceChanged`), a lost listener connection drops the
//!   snapshot, and the watch runs every [`POSTGRES_WATCH`] as a backstop.
//!
//! An entry loaded while a write commits may be stale, but it lives in the
//! snapshot of the old epoch, which the next request replaces.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{
        Arc, Mutex, RwLock, Weak,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use manifold_store::{
    AuthError, Backend, Policy, PolicyInputs, RiskTier, Store, StoreError, TokenRecord,
    ToolClassification,
};
use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

use crate::policy::{self, Verdict};

/// How often the generation is read on SQLite: the bound on how late a
/// change made by another process (the CLI) is seen, less one read.
pub const SQLITE_WATCH: Duration = Duration::from_millis(20);
/// How often on PostgreSQL, where notifications are the fast path.
pub const POSTGRES_WATCH: Duration = Duration::from_secs(1);

/// Bearers remembered per snapshot, refused ones included; beyond this the
/// map starts over, so a flood of made-up bearers cannot grow memory.
const MAX_BEARERS: usize = 4096;
/// Policy verdicts remembered per snapshot; beyond this the map starts over.
const MAX_VERDICTS: usize = 16_384;

pub(crate) struct Snapshots {
    store: Store,
    /// Changes heard from other processes (the watch, an event).
    heard: AtomicU64,
    current: RwLock<Arc<Snapshot>>,
}

/// What one bearer was, as of one snapshot. A refusal stays a refusal
/// until governance changes (a token that expired stays expired).
#[derive(Clone)]
pub(crate) enum Bearer {
    Known(TokenRecord),
    Unknown,
    Revoked,
    Expired,
}

impl Bearer {
    /// The outcome at `now`.
    pub(crate) fn at(self, now: i64) -> Result<TokenRecord, AuthError> {
        match self {
            Bearer::Known(token) if token.is_expired(now) => Err(AuthError::Expired),
            Bearer::Known(token) => Ok(token),
            Bearer::Unknown => Err(AuthError::Unknown),
            Bearer::Revoked => Err(AuthError::Revoked),
            Bearer::Expired => Err(AuthError::Expired),
        }
    }
}

#[derive(Default)]
pub(crate) struct Snapshot {
    epoch: u64,
    policies: OnceCell<Arc<Vec<Policy>>>,
    inputs: OnceCell<Arc<PolicyInputs>>,
    tokens: Mutex<HashMap<String, Option<TokenRecord>>>,
    groups: Mutex<HashMap<String, Arc<BTreeSet<String>>>>,
    classes: Mutex<HashMap<(String, String), ToolClassification>>,
    bearers: Mutex<HashMap<[u8; 32], Bearer>>,
    verdicts: Arc<Verdicts>,
}

/// What the snapshot's policies said of one caller and one tool, so that a
/// caller's next call to that tool does not match every policy again (seed
/// 001 has 373). Keyed by everything [`crate::policy::evaluate`] reads
/// besides the policies themselves, which the snapshot fixes.
#[derive(Default)]
pub(crate) struct Verdicts(Mutex<HashMap<String, Verdict>>);

impl std::fmt::Debug for Verdicts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Verdicts")
            .field(&lock(&self.0).len())
            .finish()
    }
}

impl Verdicts {
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock(&self.0).len()
    }

    /// The remembered verdict on `asked`, a caller and a tool (its server,
    /// its names and its tier), or `evaluate`'s, remembered.
    pub(crate) fn get_or(
        &self,
        asked: (policy::Subject<'_>, policy::Target<'_>, Option<RiskTier>),
        evaluate: impl FnOnce() -> Verdict,
    ) -> Verdict {
        let key = verdict_key(asked);
        if let Some(known) = lock(&self.0).get(&key) {
            return known.clone();
        }
        let verdict = evaluate();
        let mut verdicts = lock(&self.0);
        if verdicts.len() >= MAX_VERDICTS {
            verdicts.clear();
        }
        verdicts.insert(key, verdict.clone());
        verdict
    }
}

/// Each part length-prefixed, so that no two different questions give one
/// key.
fn verdict_key(
    (who, target, tier): (policy::Subject<'_>, policy::Target<'_>, Option<RiskTier>),
) -> String {
    use std::fmt::Write;
    let mut key = String::with_capacity(64);
    for part in [who.token_id, who.user] {
        let _ = match part {
            Some(part) => write!(key, "+{}:{part}", part.len()),
            None => write!(key, "-"),
        };
    }
    let _ = write!(key, "{}", who.groups.len());
    for part in who
        .groups
        .iter()
        .map(String::as_str)
        .chain([target.server, target.name])
    {
        let _ = write!(key, "{}:{part}", part.len());
    }
    if let Some(renamed) = target.renamed {
        let _ = write!(key, "={}:{renamed}", renamed.len());
    }
    let _ = write!(key, "{tier:?}");
    key
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Snapshots {
    pub(crate) fn new(store: Store) -> Snapshots {
        Snapshots {
            current: RwLock::new(Arc::new(Snapshot {
                epoch: store.governance_writes(),
                ..Snapshot::default()
            })),
            store,
            heard: AtomicU64::new(0),
        }
    }

    fn epoch(&self) -> u64 {
        self.store
            .governance_writes()
            .wrapping_add(self.heard.load(Ordering::Acquire))
    }

    /// Another process changed governance, or may have: the next request
    /// reads afresh.
    pub(crate) fn invalidate(&self) {
        self.heard.fetch_add(1, Ordering::AcqRel);
    }

    /// The snapshot of the current epoch.
    pub(crate) fn current(&self) -> Arc<Snapshot> {
        let epoch = self.epoch();
        let current = Arc::clone(&self.current.read().unwrap_or_else(|p| p.into_inner()));
        if current.epoch == epoch {
            return current;
        }
        let mut slot = self.current.write().unwrap_or_else(|p| p.into_inner());
        // Epochs only grow: a request that read an older one never replaces
        // a newer snapshot.
        if slot.epoch < epoch {
            *slot = Arc::new(Snapshot {
                epoch,
                ..Snapshot::default()
            });
            metrics::counter!("manifold_governance_snapshot_reloads_total").increment(1);
        }
        Arc::clone(&slot)
    }

    /// Watches the database's generation until `owner` is dropped.
    pub(crate) fn spawn_watch<T: Send + Sync + 'static>(
        owner: Weak<T>,
        snapshots: impl Fn(&T) -> &Snapshots + Send + 'static,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let mut last: Option<i64> = None;
            let (reader, every) = {
                let Some(owner) = owner.upgrade() else { return };
                let store = &snapshots(&owner).store;
                let every = match store.backend() {
                    Backend::Sqlite => SQLITE_WATCH,
                    Backend::Postgres => POSTGRES_WATCH,
                };
                (store.generation_reader(), every)
            };
            loop {
                let read = reader.read().await;
                let Some(owner) = owner.upgrade() else { return };
                match read {
                    Ok(generation) if last == Some(generation) => {}
                    // Changed, or the first reading (after a start or an
                    // error): whatever was loaded before it may be stale.
                    Ok(generation) => {
                        snapshots(&owner).invalidate();
                        last = Some(generation);
                    }
                    // Cannot tell: decide from the store until it answers.
                    Err(error) => {
                        tracing::debug!(%error, "governance generation unreadable");
                        snapshots(&owner).invalidate();
                        last = None;
                    }
                }
                drop(owner);
                tokio::time::sleep(every).await;
            }
        });
    }
}

impl Snapshot {
    pub(crate) fn verdicts(&self) -> &Arc<Verdicts> {
        &self.verdicts
    }

    pub(crate) async fn policies(&self, store: &Store) -> Result<Arc<Vec<Policy>>, StoreError> {
        self.policies
            .get_or_try_init(|| async { store.list_policies().await.map(Arc::new) })
            .await
            .cloned()
    }

    /// Everything a listing reads, loaded once per snapshot.
    pub(crate) async fn inputs(&self, store: &Store) -> Result<Arc<PolicyInputs>, StoreError> {
        self.inputs
            .get_or_try_init(|| async { store.load_policy_inputs().await.map(Arc::new) })
            .await
            .cloned()
    }

    pub(crate) async fn token(
        &self,
        store: &Store,
        id: &str,
    ) -> Result<Option<TokenRecord>, StoreError> {
        if let Some(known) = lock(&self.tokens).get(id) {
            return Ok(known.clone());
        }
        let loaded = store.get_token(id).await?;
        lock(&self.tokens).insert(id.to_string(), loaded.clone());
        Ok(loaded)
    }

    pub(crate) async fn groups(
        &self,
        store: &Store,
        token_id: &str,
    ) -> Result<Arc<BTreeSet<String>>, StoreError> {
        if let Some(known) = lock(&self.groups).get(token_id) {
            return Ok(Arc::clone(known));
        }
        let loaded: Arc<BTreeSet<String>> =
            Arc::new(store.token_groups(token_id).await?.into_iter().collect());
        lock(&self.groups).insert(token_id.to_string(), Arc::clone(&loaded));
        Ok(loaded)
    }

    /// The classification of a tool whose definition hashes to `hash`, if
    /// this snapshot has it for that very definition.
    pub(crate) fn classification(
        &self,
        server: &str,
        tool: &str,
        hash: &str,
    ) -> Option<ToolClassification> {
        let classes = lock(&self.classes);
        let class = classes.get(&(server.to_string(), tool.to_string()))?;
        (class.definition_hash == hash).then(|| class.clone())
    }

    pub(crate) fn remember_classification(&self, class: &ToolClassification) {
        lock(&self.classes).insert((class.server.clone(), class.tool.clone()), class.clone());
    }

    /// What `bearer` named when this snapshot was taken; `None` if it was
    /// not asked yet. Expiry is the caller's to check, against its own now.
    pub(crate) fn bearer(&self, bearer: &str) -> Option<Bearer> {
        lock(&self.bearers).get(&digest(bearer)).cloned()
    }

    pub(crate) fn remember_bearer(&self, bearer: &str, outcome: &Result<TokenRecord, AuthError>) {
        let remembered = match outcome {
            Ok(token) => Bearer::Known(token.clone()),
            Err(AuthError::Unknown) => Bearer::Unknown,
            Err(AuthError::Revoked) => Bearer::Revoked,
            Err(AuthError::Expired) => Bearer::Expired,
            // Malformed ones never reach the store; store errors may pass.
            Err(_) => return,
        };
        let mut bearers = lock(&self.bearers);
        if bearers.len() >= MAX_BEARERS {
            bearers.clear();
        }
        bearers.insert(digest(bearer), remembered);
    }
}

/// The bearer is not kept, only its digest.
fn digest(bearer: &str) -> [u8; 32] {
    Sha256::digest(bearer.as_bytes()).into()
}
