use std::{
    collections::{BTreeMap, HashMap},
    hash::{Hash, Hasher},
    sync::{
        Arc, Mutex, OnceLock, RwLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use manifold_upstream::{CacheScope, Upstream, UpstreamError, UpstreamEvent, UpstreamStatus};
use rmcp::model::Tool;
use tokio::sync::mpsc;

use crate::tool::{CatalogTool, shape_listing};

/// An opaque authorization context. Private listings are cached per principal and
/// never shared across principals.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Principal(pub String);

impl Principal {
    pub fn anonymous() -> Self {
        Principal("anonymous".to_string())
    }
}

#[derive(Clone)]
struct Snapshot {
    tools: Arc<Vec<Arc<CatalogTool>>>,
    fetched_at: Instant,
    ttl: Duration,
    invalidated: bool,
    last_error: Option<String>,
    /// After a failed refresh, callers get the stale listing until then instead of
    /// each waiting out the upstream's timeout again.
    retry_at: Option<Instant>,
    generation: u64,
}

/// How long a failed server is left alone before the next refresh attempt.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(5);

/// How far past its `ttlMs` a listing may still route a call while a
/// refresh in the background replaces it. Upstreams that send `ttlMs: 0`
/// (rmcp fills that in for 2026-07-28 peers when a server names none) would
/// otherwise cost a `tools/list` per call. What callers are shown never
/// uses this grace.
pub const CALL_GRACE: Duration = Duration::from_secs(1);
/// Under a steady stream of calls, a listing past its TTL is refreshed in
/// the background at most this often.
pub const CALL_REFRESH_EVERY: Duration = Duration::from_millis(500);

impl Snapshot {
    fn is_fresh(&self) -> bool {
        !self.invalidated && self.last_error.is_none() && self.fetched_at.elapsed() < self.ttl
    }

    fn in_cooldown(&self) -> bool {
        !self.invalidated && self.retry_at.is_some_and(|t| Instant::now() < t)
    }

    /// Recent enough to route a call: within [`CALL_GRACE`] of its TTL, and
    /// not invalidated by a `list_changed`.
    fn routes_calls(&self) -> bool {
        !self.invalidated
            && self.last_error.is_none()
            && self.fetched_at.elapsed() < self.ttl + CALL_GRACE
    }
}

#[derive(Default)]
struct Cached {
    /// The scope the upstream last declared; decides where a caller looks.
    scope: Option<CacheScope>,
    public: Option<Snapshot>,
    private: HashMap<Principal, Snapshot>,
}

/// Caps the private cache of one server so many callers cannot grow it forever.
const MAX_PRIVATE_ENTRIES: usize = 1024;
/// Caps how many principals keep server switches of their own.
const MAX_SWITCHING_PRINCIPALS: usize = 4096;

struct ServerSlot {
    upstream: Arc<Upstream>,
    enabled: AtomicBool,
    cached: Mutex<Cached>,
    /// One fetch at a time per server; others wait and reuse its result.
    fetching: tokio::sync::Mutex<()>,
    /// A refresh for calls is running in the background.
    refreshing: AtomicBool,
    /// What the last listing said of the server's tool overrides that it
    /// could not apply.
    unmatched_overrides: Mutex<Vec<String>>,
}

impl ServerSlot {
    fn new(upstream: Arc<Upstream>) -> Arc<Self> {
        let enabled = upstream.config().autoconnect;
        Arc::new(ServerSlot {
            upstream,
            enabled: AtomicBool::new(enabled),
            refreshing: AtomicBool::new(false),
            unmatched_overrides: Mutex::new(Vec::new()),
            cached: Mutex::new(Cached::default()),
            fetching: tokio::sync::Mutex::new(()),
        })
    }

    /// Keeps what a listing said of the overrides it could not apply, and
    /// logs it when it changed (at start, and after each change).
    fn note_unmatched_overrides(&self, unmatched: Vec<String>) {
        let mut known = self.unmatched_overrides.lock().expect("overrides lock");
        if *known != unmatched {
            for problem in &unmatched {
                tracing::warn!(server = %self.upstream.name(), "tool override not applied: {problem}");
            }
            *known = unmatched;
        }
    }

    fn snapshot_for(&self, principal: &Principal) -> Option<Snapshot> {
        let cached = self.cached.lock().expect("cache lock");
        match cached.scope {
            Some(CacheScope::Public) => cached.public.clone(),
            Some(CacheScope::Private) => cached.private.get(principal).cloned(),
            None => None,
        }
    }
}

/// A caller's consistent picture of the catalog for one request.
pub struct CatalogView {
    /// Identifies this exact set of snapshots; equal keys mean equal contents.
    pub key: u64,
    pub servers: Vec<ServerView>,
    by_name: HashMap<String, Arc<CatalogTool>>,
}

pub struct ServerView {
    pub name: String,
    pub description: String,
    /// The listing is the last good one, served because a refresh failed.
    pub stale: bool,
    pub error: Option<String>,
    pub tools: Arc<Vec<Arc<CatalogTool>>>,
}

impl CatalogView {
    /// A view built straight from tool lists, with no upstream behind it: for
    /// benchmarks, evaluation and offline tools. `(server, description, tools)`.
    pub fn from_listings(listings: Vec<(String, String, Vec<Tool>)>, qualify_names: bool) -> Self {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        let mut by_name = HashMap::new();
        let mut servers = Vec::new();
        for (name, description, tools) in listings {
            let tools: Vec<_> = tools
                .into_iter()
                .map(|t| Arc::new(CatalogTool::new(&name, t, qualify_names)))
                .collect();
            for tool in &tools {
                tool.hash.hash(&mut hasher);
                by_name
                    .entry(tool.qualified.clone())
                    .or_insert_with(|| Arc::clone(tool));
            }
            servers.push(ServerView {
                name,
                description,
                stale: false,
                error: None,
                tools: Arc::new(tools),
            });
        }
        Self {
            key: hasher.finish(),
            servers,
            by_name,
        }
    }

    /// The tools for which `keep` holds, under a key derived from this
    /// view's key and the kept names, so search indexes of differently
    /// filtered views never mix.
    pub fn filtered(&self, mut keep: impl FnMut(&CatalogTool) -> bool) -> CatalogView {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.key.hash(&mut hasher);
        let mut by_name = HashMap::new();
        let servers = self
            .servers
            .iter()
            .map(|s| {
                let tools: Vec<_> = s.tools.iter().filter(|t| keep(t)).cloned().collect();
                for tool in &tools {
                    tool.qualified.hash(&mut hasher);
                    by_name
                        .entry(tool.qualified.clone())
                        .or_insert_with(|| Arc::clone(tool));
                }
                ServerView {
                    name: s.name.clone(),
                    description: s.description.clone(),
                    stale: s.stale,
                    error: s.error.clone(),
                    tools: Arc::new(tools),
                }
            })
            .collect();
        CatalogView {
            key: hasher.finish(),
            servers,
            by_name,
        }
    }

    pub fn tool(&self, qualified: &str) -> Option<&Arc<CatalogTool>> {
        self.by_name.get(qualified)
    }

    pub fn tools(&self) -> impl Iterator<Item = &Arc<CatalogTool>> {
        self.servers.iter().flat_map(|s| s.tools.iter())
    }

    pub fn tool_count(&self) -> usize {
        self.by_name.len()
    }

    pub fn definition_tokens(&self) -> usize {
        self.tools().map(|t| t.tokens()).sum()
    }

    pub fn server(&self, name: &str) -> Option<&ServerView> {
        self.servers.iter().find(|s| s.name == name)
    }
}

/// Every upstream and its memoized tools.
pub struct ToolCatalog {
    slots: RwLock<BTreeMap<String, Arc<ServerSlot>>>,
    qualify_names: bool,
    generations: AtomicU64,
    /// The last view built for each principal.
    views: Mutex<HashMap<Principal, Arc<CatalogView>>>,
    /// Servers a principal switched for itself (`enable_server`,
    /// `disable_server`): `true` shows a server the operator left off,
    /// `false` hides one. Nobody else's view changes.
    switches: Mutex<HashMap<Principal, BTreeMap<String, bool>>>,
}

impl ToolCatalog {
    pub fn new(upstreams: Vec<Arc<Upstream>>, qualify_names: bool) -> Arc<Self> {
        let slots = upstreams
            .into_iter()
            .map(|u| (u.name().to_string(), ServerSlot::new(u)))
            .collect();
        Arc::new(Self {
            slots: RwLock::new(slots),
            qualify_names,
            generations: AtomicU64::new(0),
            views: Mutex::new(HashMap::new()),
            switches: Mutex::new(HashMap::new()),
        })
    }

    /// Adds a server, or replaces the one of the same name (with an empty
    /// cache). Returns the upstream it replaced: calls already holding it
    /// finish on it, while new calls resolve to the new one.
    pub fn insert_server(&self, upstream: Arc<Upstream>) -> Option<Arc<Upstream>> {
        let name = upstream.name().to_string();
        let old = self
            .slots
            .write()
            .expect("slots lock")
            .insert(name, ServerSlot::new(upstream));
        old.map(|slot| Arc::clone(&slot.upstream))
    }

    /// Takes a server out: its tools leave every view built from now on.
    /// Returns its upstream, so that calls in flight can finish on it.
    pub fn remove_server(&self, server: &str) -> Option<Arc<Upstream>> {
        let old = self.slots.write().expect("slots lock").remove(server);
        old.map(|slot| Arc::clone(&slot.upstream))
    }

    fn slot(&self, server: &str) -> Option<Arc<ServerSlot>> {
        self.slots.read().expect("slots lock").get(server).cloned()
    }

    fn all_slots(&self) -> Vec<Arc<ServerSlot>> {
        self.slots
            .read()
            .expect("slots lock")
            .values()
            .cloned()
            .collect()
    }

    /// The tool overrides of `server` that its last listing could not
    /// apply, each with the reason (shown by the console and the admin API).
    pub fn unmatched_overrides(&self, server: &str) -> Vec<String> {
        self.slot(server)
            .map(|s| {
                s.unmatched_overrides
                    .lock()
                    .expect("overrides lock")
                    .clone()
            })
            .unwrap_or_default()
    }

    pub fn upstream(&self, server: &str) -> Option<Arc<Upstream>> {
        self.slot(server).map(|s| Arc::clone(&s.upstream))
    }

    /// The tool exposed as `name` as a listing already read it, reading
    /// nothing: for checks that cannot wait (a request's `Mcp-Param-*`
    /// headers against the tool's schema). `None` until a listing has it.
    pub fn cached_tool(&self, name: &str) -> Option<Arc<CatalogTool>> {
        self.all_slots().iter().find_map(|slot| {
            let cached = slot.cached.lock().expect("cache lock");
            let mut snapshots = cached.public.iter().chain(cached.private.values());
            snapshots.find_map(|s| s.tools.iter().find(|t| t.qualified == name).cloned())
        })
    }

    /// Whether names are qualified as `server__name`.
    pub fn qualifies_names(&self) -> bool {
        self.qualify_names
    }

    /// The upstreams of enabled servers with a live connection, in config order.
    pub fn connected_upstreams(&self) -> Vec<Arc<Upstream>> {
        self.all_slots()
            .iter()
            .filter(|s| s.enabled.load(Ordering::SeqCst) && s.upstream.is_connected())
            .map(|s| Arc::clone(&s.upstream))
            .collect()
    }

    pub fn upstreams(&self) -> Vec<Arc<Upstream>> {
        self.all_slots()
            .iter()
            .map(|s| Arc::clone(&s.upstream))
            .collect()
    }

    /// Whether the server is on for everyone (config or operator).
    pub fn is_enabled(&self, server: &str) -> bool {
        self.slot(server)
            .is_some_and(|s| s.enabled.load(Ordering::SeqCst))
    }

    /// Whether the server is in `principal`'s view: its own switch if it
    /// made one, else the operator's.
    pub fn is_enabled_for(&self, server: &str, principal: &Principal) -> bool {
        self.slot(server)
            .is_some_and(|slot| self.enabled_for(&slot, principal))
    }

    fn enabled_for(&self, slot: &ServerSlot, principal: &Principal) -> bool {
        let own = self
            .switches
            .lock()
            .expect("switches lock")
            .get(principal)
            .and_then(|servers| servers.get(slot.upstream.name()).copied());
        own.unwrap_or_else(|| slot.enabled.load(Ordering::SeqCst))
    }

    fn switch_for(&self, server: &str, principal: &Principal, on: bool) {
        let mut switches = self.switches.lock().expect("switches lock");
        // Without auth every bearer names a principal: stay bounded.
        if switches.len() >= MAX_SWITCHING_PRINCIPALS && !switches.contains_key(principal) {
            let evicted = switches.keys().next().cloned();
            if let Some(evicted) = evicted {
                switches.remove(&evicted);
            }
        }
        switches
            .entry(principal.clone())
            .or_default()
            .insert(server.to_string(), on);
    }

    /// Drops every principal's own switch of `server`, so that an
    /// operator's switch applies to everyone.
    fn clear_switches(&self, server: &str) {
        let mut switches = self.switches.lock().expect("switches lock");
        for servers in switches.values_mut() {
            servers.remove(server);
        }
        switches.retain(|_, servers| !servers.is_empty());
    }

    /// Status of every configured server, enabled or not.
    pub fn statuses(&self) -> Vec<(UpstreamStatus, bool)> {
        self.all_slots()
            .iter()
            .map(|s| (s.upstream.status(), s.enabled.load(Ordering::SeqCst)))
            .collect()
    }

    /// Connect every enabled server, concurrently. Failures are recorded in each
    /// server's status; they never stop the others.
    pub async fn connect_enabled(&self) {
        let slots: Vec<_> = self
            .all_slots()
            .into_iter()
            .filter(|s| s.enabled.load(Ordering::SeqCst))
            .collect();
        let connects = slots.iter().map(|s| async move {
            if let Err(e) = s.upstream.connect().await {
                tracing::warn!(server = %s.upstream.name(), error = %e, "connect failed");
            }
        });
        futures::future::join_all(connects).await;
    }

    /// Mark a server's listings stale at once, whatever their TTL.
    pub fn invalidate(&self, server: &str) {
        if let Some(slot) = self.slot(server) {
            let mut cached = slot.cached.lock().expect("cache lock");
            if let Some(s) = cached.public.as_mut() {
                s.invalidated = true;
            }
            for s in cached.private.values_mut() {
                s.invalidated = true;
            }
        }
    }

    /// Apply upstream events until the channel closes. `on_event` sees every
    /// event after the catalog has applied it (a tool change has invalidated
    /// the server's listings by then).
    pub fn spawn_event_loop(
        self: &Arc<Self>,
        mut events: mpsc::UnboundedReceiver<UpstreamEvent>,
        on_event: impl Fn(&UpstreamEvent) + Send + 'static,
    ) {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                if let UpstreamEvent::ToolsChanged { server } = &event {
                    tracing::info!(server = %server, "tool list changed; cache invalidated");
                    this.invalidate(server);
                }
                on_event(&event);
            }
        });
    }

    /// Connect a server (if needed), list and index its tools, for everyone
    /// (an operator's switch; every principal's own switch of it is
    /// dropped). Returns its tool count.
    pub async fn enable(
        &self,
        server: &str,
        principal: &Principal,
    ) -> Result<usize, UpstreamError> {
        let slot = self.slot_or_error(server)?;
        slot.upstream.connect().await?;
        slot.enabled.store(true, Ordering::SeqCst);
        self.clear_switches(server);
        self.invalidate(server);
        if slot.upstream.per_principal() {
            // Each caller lists it with its own token; the operator's
            // listing would say nothing about theirs.
            return Ok(0);
        }
        self.index(&slot, principal).await
    }

    /// Close a server's connection and drop its tools, for everyone (an
    /// operator's switch; every principal's own switch of it is dropped).
    pub async fn disable(&self, server: &str) -> Result<(), UpstreamError> {
        let slot = self.slot_or_error(server)?;
        slot.enabled.store(false, Ordering::SeqCst);
        self.clear_switches(server);
        slot.upstream.disconnect().await;
        *slot.cached.lock().expect("cache lock") = Cached::default();
        Ok(())
    }

    /// Put a server in `principal`'s view only, connecting it if needed
    /// (the connection is shared; what others see does not change).
    /// Returns its tool count. The caller must have been authorised for
    /// the server first: this may spawn a process.
    pub async fn enable_for(
        &self,
        server: &str,
        principal: &Principal,
    ) -> Result<usize, UpstreamError> {
        let slot = self.slot_or_error(server)?;
        slot.upstream.connect().await?;
        self.switch_for(server, principal, true);
        self.index(&slot, principal).await
    }

    /// Take a server out of `principal`'s view only. The connection stays,
    /// for everyone else. False when there is no such server.
    pub fn disable_for(&self, server: &str, principal: &Principal) -> bool {
        if self.slot(server).is_none() {
            return false;
        }
        self.switch_for(server, principal, false);
        true
    }

    // The callers return `UpstreamError` already; boxing it here buys nothing.
    #[allow(clippy::result_large_err)]
    fn slot_or_error(&self, server: &str) -> Result<Arc<ServerSlot>, UpstreamError> {
        self.slot(server)
            .ok_or_else(|| UpstreamError::NotConnected {
                server: server.to_string(),
            })
    }

    async fn index(
        &self,
        slot: &ServerSlot,
        principal: &Principal,
    ) -> Result<usize, UpstreamError> {
        let snapshot = match slot.snapshot_for(principal) {
            Some(s) if s.is_fresh() => s,
            _ => self.refresh(slot, principal).await,
        };
        match snapshot.last_error {
            Some(e) if snapshot.tools.is_empty() => Err(UpstreamError::Protocol {
                server: slot.upstream.name().to_string(),
                message: e,
            }),
            _ => Ok(snapshot.tools.len()),
        }
    }

    /// The catalog as `principal` sees it now. Refreshes what is expired,
    /// concurrently, each within its server's list timeout.
    pub async fn view(&self, principal: &Principal) -> Arc<CatalogView> {
        self.view_inner(principal, None).await
    }

    /// The view a call to `name` resolves in. A listing up to
    /// [`CALL_GRACE`] past its TTL still routes calls while one background
    /// refresh per server replaces it; a name that view lacks is looked up
    /// again in a fresh [`ToolCatalog::view`], so a tool added upstream is
    /// found on its first call.
    pub async fn view_for_call(
        self: &Arc<Self>,
        principal: &Principal,
        name: &str,
    ) -> Arc<CatalogView> {
        let view = self.view_inner(principal, Some(self)).await;
        if view.tool(name).is_some() {
            return view;
        }
        self.view(principal).await
    }

    async fn view_inner(
        &self,
        principal: &Principal,
        for_call: Option<&Arc<Self>>,
    ) -> Arc<CatalogView> {
        let slots: Vec<_> = self
            .all_slots()
            .into_iter()
            .filter(|s| self.enabled_for(s, principal))
            .collect();
        // Most calls find every listing usable as cached: no future at all
        // then, only the refreshes that are due are awaited, together.
        let mut snapshots = Vec::with_capacity(slots.len());
        let mut due = Vec::new();
        for (i, slot) in slots.iter().enumerate() {
            match self.cached_snapshot(slot, principal, for_call) {
                Some(cached) => snapshots.push(cached),
                None => {
                    snapshots.push(None);
                    due.push(i);
                }
            }
        }
        if !due.is_empty() {
            let refreshed =
                futures::future::join_all(due.iter().map(|&i| self.refresh(&slots[i], principal)))
                    .await;
            for (i, snapshot) in due.into_iter().zip(refreshed) {
                snapshots[i] = Some(snapshot);
            }
        }
        // Most requests see exactly the view the previous one saw; reuse it
        // instead of rebuilding the name map for every call.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for (slot, snapshot) in slots.iter().zip(&snapshots) {
            if let Some(snapshot) = snapshot {
                slot.upstream.name().hash(&mut hasher);
                snapshot.generation.hash(&mut hasher);
                snapshot.last_error.hash(&mut hasher);
            }
        }
        let key = hasher.finish();
        if let Some(view) = self.views.lock().expect("views lock").get(principal)
            && view.key == key
        {
            return Arc::clone(view);
        }
        let mut servers = Vec::new();
        let mut by_name = HashMap::new();
        for (slot, snapshot) in slots.iter().zip(snapshots) {
            let Some(snapshot) = snapshot else { continue };
            for tool in snapshot.tools.iter() {
                // With unqualified names, the first server wins a clash; later ones
                // are reported in the log rather than silently shadowing.
                if by_name.contains_key(&tool.qualified) {
                    tracing::warn!(tool = %tool.qualified, server = %tool.server, "duplicate tool name ignored");
                    continue;
                }
                by_name.insert(tool.qualified.clone(), Arc::clone(tool));
            }
            let config = slot.upstream.config();
            servers.push(ServerView {
                name: config.name.clone(),
                description: config.description.clone(),
                stale: snapshot.last_error.is_some(),
                error: snapshot.last_error.clone(),
                tools: snapshot.tools,
            });
        }
        let view = Arc::new(CatalogView {
            key,
            servers,
            by_name,
        });
        let mut views = self.views.lock().expect("views lock");
        if views.len() >= MAX_PRIVATE_ENTRIES {
            views.clear();
        }
        views.insert(principal.clone(), Arc::clone(&view));
        view
    }

    /// What `slot` serves `principal` without waiting, or `None` if its
    /// listing must be refreshed first. A call (`for_call`) may route through
    /// a listing just past its TTL while one refresh runs in the background;
    /// a server that is down serves its last good listing, marked stale.
    fn cached_snapshot(
        &self,
        slot: &Arc<ServerSlot>,
        principal: &Principal,
        for_call: Option<&Arc<Self>>,
    ) -> Option<Option<Snapshot>> {
        match slot.snapshot_for(principal) {
            Some(s) if s.is_fresh() || s.in_cooldown() => {
                cache_lookup("catalog", true);
                Some(Some(s))
            }
            Some(s) if for_call.is_some() && s.routes_calls() => {
                cache_lookup("catalog", true);
                if let Some(catalog) = for_call
                    && s.fetched_at.elapsed() >= CALL_REFRESH_EVERY
                {
                    catalog.refresh_in_background(slot, principal);
                }
                Some(Some(s))
            }
            existing => {
                cache_lookup("catalog", false);
                if slot.upstream.is_connected() {
                    return None;
                }
                Some(existing.map(|mut s| {
                    s.last_error.get_or_insert_with(|| {
                        format!("server '{}' is not connected", slot.upstream.name())
                    });
                    s
                }))
            }
        }
    }

    /// Starts one refresh of `slot` for `principal` unless one is running.
    fn refresh_in_background(self: &Arc<Self>, slot: &Arc<ServerSlot>, principal: &Principal) {
        if slot.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let (catalog, slot, principal) = (Arc::clone(self), Arc::clone(slot), principal.clone());
        tokio::spawn(async move {
            catalog.refresh(&slot, &principal).await;
            slot.refreshing.store(false, Ordering::Release);
        });
    }

    async fn refresh(&self, slot: &ServerSlot, principal: &Principal) -> Snapshot {
        let _one_at_a_time = slot.fetching.lock().await;
        // Another caller may have refreshed while we waited.
        if let Some(s) = slot.snapshot_for(principal).filter(Snapshot::is_fresh) {
            return s;
        }
        let server = slot.upstream.name().to_string();
        // A per-principal server lists what each caller's own token shows.
        let per_principal = slot.upstream.per_principal();
        match slot.upstream.list_tools_for(&principal.0).await {
            Ok(mut listing) => {
                if per_principal {
                    listing.scope = CacheScope::Private;
                }
                let ttl = Duration::from_millis(
                    listing
                        .ttl_ms
                        .unwrap_or(slot.upstream.config().default_ttl_ms),
                );
                let overrides = &slot.upstream.config().tools;
                let shaped = shape_listing(&server, listing.items, overrides, self.qualify_names);
                slot.note_unmatched_overrides(shaped.unmatched);
                let tools: Vec<_> = shaped.tools.into_iter().map(Arc::new).collect();
                let snapshot = Snapshot {
                    tools: Arc::new(tools),
                    fetched_at: Instant::now(),
                    ttl,
                    invalidated: false,
                    last_error: None,
                    retry_at: None,
                    generation: self.generations.fetch_add(1, Ordering::SeqCst) + 1,
                };
                let mut cached = slot.cached.lock().expect("cache lock");
                cached.scope = Some(listing.scope);
                match listing.scope {
                    CacheScope::Public => {
                        cached.private.clear();
                        cached.public = Some(snapshot.clone());
                    }
                    CacheScope::Private => {
                        cached.public = None;
                        if cached.private.len() >= MAX_PRIVATE_ENTRIES
                            && !cached.private.contains_key(principal)
                        {
                            let oldest = cached
                                .private
                                .iter()
                                .min_by_key(|(_, s)| s.fetched_at)
                                .map(|(p, _)| p.clone());
                            if let Some(p) = oldest {
                                cached.private.remove(&p);
                            }
                        }
                        cached.private.insert(principal.clone(), snapshot.clone());
                    }
                }
                snapshot
            }
            Err(error) => {
                tracing::warn!(server = %server, error = %error, "tools/list failed; serving last good listing");
                let previous = slot.snapshot_for(principal);
                let mut snapshot = previous.unwrap_or_else(|| Snapshot {
                    tools: Arc::new(Vec::new()),
                    fetched_at: Instant::now(),
                    ttl: Duration::ZERO,
                    invalidated: false,
                    last_error: None,
                    retry_at: None,
                    generation: self.generations.fetch_add(1, Ordering::SeqCst) + 1,
                });
                snapshot.last_error = Some(error.to_string());
                snapshot.invalidated = false;
                snapshot.retry_at = Some(Instant::now() + RETRY_AFTER_FAILURE);
                let mut cached = slot.cached.lock().expect("cache lock");
                let scope = if per_principal {
                    *cached.scope.insert(CacheScope::Private)
                } else {
                    *cached.scope.get_or_insert(CacheScope::Private)
                };
                match scope {
                    CacheScope::Public => cached.public = Some(snapshot.clone()),
                    CacheScope::Private => {
                        cached.private.insert(principal.clone(), snapshot.clone());
                    }
                }
                snapshot
            }
        }
    }
}

/// The caches [`cache_lookup`] keeps counter handles for; a call takes
/// the catalog's and the validators' on every call.
const CACHES: [&str; 4] = ["catalog", "validators", "search_index", "code_bindings"];

/// Counts one lookup in one of the gateway's caches, for `/metrics`. The
/// handles are kept once registered (the gateway installs its recorder
/// before it builds anything that looks up a cache).
pub fn cache_lookup(cache: &'static str, hit: bool) {
    static HANDLES: [[OnceLock<metrics::Counter>; 2]; CACHES.len()] =
        [const { [const { OnceLock::new() }; 2] }; CACHES.len()];
    let result = if hit { "hit" } else { "miss" };
    let register =
        || metrics::counter!("manifold_cache_requests_total", "cache" => cache, "result" => result);
    match CACHES.iter().position(|known| *known == cache) {
        Some(index) => HANDLES[index][usize::from(hit)]
            .get_or_init(register)
            .increment(1),
        None => register().increment(1),
    }
}
