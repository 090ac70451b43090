//! Prompts, resources and resource templates of every connected upstream, for
//! direct mode.
//!
//! Unlike tools these are not memoized: each downstream listing asks the
//! upstreams that declared the capability, concurrently, each within its list
//! timeout (a failing server is left out and logged). Prompt names are
//! qualified like tool names (`server__prompt`, unchanged when `qualify_names`
//! is off); resources keep their URIs. Each listing records where every prompt
//! name and resource URI lives, so `prompts/get` and `resources/read` find
//! their server; a URI that no listing named is matched against the resource
//! templates, then offered to each resource server in config order.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use manifold_upstream::{Listing, Upstream, UpstreamError};
use rmcp::model::{Prompt, Resource, ResourceTemplate, ServerCapabilities};

use crate::{ToolCatalog, qualify, split_qualified};

/// Prompts and resources of the catalog's connected upstreams, and where each
/// one lives.
pub struct PrimitiveCatalog {
    catalog: Arc<ToolCatalog>,
    routes: Routes,
}

/// Where prompts and resources were last seen.
#[derive(Default)]
struct Routes {
    /// Exposed prompt name → (server, upstream prompt name).
    prompts: Mutex<HashMap<String, (String, String)>>,
    /// Resource URI → server.
    resources: Mutex<HashMap<String, String>>,
    /// (server, URI template), in config order.
    templates: Mutex<Vec<(String, String)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A listed prompt, resource or template and where it lives: the server,
/// and its name there (a prompt's upstream name, a resource's URI, a
/// template's URI template).
#[derive(Debug, Clone)]
pub struct Listed<T> {
    pub server: String,
    pub name: String,
    pub item: T,
}

/// One upstream's listing of some primitive, or why it is missing.
type Fetched<T> = (Arc<Upstream>, Result<Listing<T>, UpstreamError>);

impl PrimitiveCatalog {
    pub fn new(catalog: Arc<ToolCatalog>) -> Self {
        Self {
            catalog,
            routes: Routes::default(),
        }
    }

    fn qualify_names(&self) -> bool {
        self.catalog.qualifies_names()
    }

    /// The upstream of `server` if it is on for everyone. Only the broker
    /// sends requests to it, once a caller's request was allowed.
    pub fn upstream(&self, server: &str) -> Option<Arc<Upstream>> {
        self.catalog
            .upstream(server)
            .filter(|_| self.catalog.is_enabled(server))
    }

    /// Connected upstreams whose capabilities pass `declared`.
    fn declaring(&self, declared: impl Fn(&ServerCapabilities) -> bool) -> Vec<Arc<Upstream>> {
        self.catalog
            .connected_upstreams()
            .into_iter()
            .filter(|u| u.capabilities().is_some_and(|c| declared(&c)))
            .collect()
    }

    async fn fetch_all<T, F, Fut>(&self, upstreams: Vec<Arc<Upstream>>, fetch: F) -> Vec<Fetched<T>>
    where
        F: Fn(Arc<Upstream>) -> Fut,
        Fut: Future<Output = Result<Listing<T>, UpstreamError>>,
    {
        let fetches = upstreams.into_iter().map(|u| {
            let listing = fetch(Arc::clone(&u));
            async move { (u, listing.await) }
        });
        futures::future::join_all(fetches).await
    }

    fn ok_listings<T>(what: &str, fetched: Vec<Fetched<T>>) -> Vec<(Arc<Upstream>, Vec<T>)> {
        fetched
            .into_iter()
            .filter_map(|(upstream, listing)| match listing {
                Ok(listing) => Some((upstream, listing.items)),
                Err(error) => {
                    tracing::warn!(server = %upstream.name(), %error, "{what} failed; server left out");
                    None
                }
            })
            .collect()
    }

    /// Whether any connected upstream declared `capability`.
    pub fn any_declares(&self, declared: impl Fn(&ServerCapabilities) -> bool) -> bool {
        !self.declaring(declared).is_empty()
    }

    /// Every prompt of every connected server, under its exposed name, with
    /// its server and upstream name (governance decides on those). With
    /// unqualified names the first server (in config order) wins a clash.
    pub async fn list_prompts(&self) -> Vec<Listed<Prompt>> {
        let upstreams = self.declaring(|c| c.prompts.is_some());
        let fetched = self
            .fetch_all(upstreams, |u| async move { u.list_prompts().await })
            .await;
        let mut routes = HashMap::new();
        let mut prompts = Vec::new();
        for (upstream, items) in Self::ok_listings("prompts/list", fetched) {
            let server = upstream.name();
            for mut prompt in items {
                let exposed = if self.qualify_names() {
                    qualify(server, &prompt.name)
                } else {
                    prompt.name.clone()
                };
                if routes.contains_key(&exposed) {
                    tracing::warn!(prompt = %exposed, server, "duplicate prompt name ignored");
                    continue;
                }
                routes.insert(exposed.clone(), (server.to_string(), prompt.name.clone()));
                let upstream_name = std::mem::replace(&mut prompt.name, exposed);
                prompts.push(Listed {
                    server: server.to_string(),
                    name: upstream_name,
                    item: prompt,
                });
            }
        }
        *lock(&self.routes.prompts) = routes;
        prompts
    }

    /// The server and upstream name of the prompt exposed as `name`, without
    /// asking any upstream: where the last listing saw it, else (with
    /// qualified names) what the name says. The flag is true when a listing
    /// saw it; a name only split may be a shortened one, which
    /// [`PrimitiveCatalog::find_prompt`] resolves by listing.
    pub fn prompt_route(&self, name: &str) -> Option<(String, String, bool)> {
        if let Some((server, upstream_name)) = lock(&self.routes.prompts).get(name).cloned() {
            return Some((server, upstream_name, true));
        }
        if !self.qualify_names() {
            return None;
        }
        let (server, prompt) = split_qualified(name)?;
        self.catalog.upstream(server)?;
        Some((server.to_string(), prompt.to_string(), false))
    }

    /// Like [`PrimitiveCatalog::prompt_route`], listing prompts first when the
    /// last listing did not name it.
    pub async fn find_prompt(&self, name: &str) -> Option<(String, String)> {
        if let Some((server, upstream_name, true)) = self.prompt_route(name) {
            return Some((server, upstream_name));
        }
        self.list_prompts().await;
        self.prompt_route(name).map(|(s, n, _)| (s, n))
    }

    /// Every resource of every connected server, with its server; URIs are
    /// left as they are.
    pub async fn list_resources(&self) -> Vec<Listed<Resource>> {
        let upstreams = self.declaring(|c| c.resources.is_some());
        let fetched = self
            .fetch_all(upstreams, |u| async move { u.list_resources().await })
            .await;
        let mut routes = HashMap::new();
        let mut resources = Vec::new();
        for (upstream, items) in Self::ok_listings("resources/list", fetched) {
            for resource in items {
                if routes.contains_key(&resource.uri) {
                    continue;
                }
                routes.insert(resource.uri.clone(), upstream.name().to_string());
                resources.push(Listed {
                    server: upstream.name().to_string(),
                    name: resource.uri.clone(),
                    item: resource,
                });
            }
        }
        *lock(&self.routes.resources) = routes;
        resources
    }

    /// Every resource template of every connected server, with its server.
    pub async fn list_resource_templates(&self) -> Vec<Listed<ResourceTemplate>> {
        let upstreams = self.declaring(|c| c.resources.is_some());
        let fetched = self
            .fetch_all(
                upstreams,
                |u| async move { u.list_resource_templates().await },
            )
            .await;
        let mut routes = Vec::new();
        let mut templates = Vec::new();
        for (upstream, items) in Self::ok_listings("resources/templates/list", fetched) {
            for template in items {
                routes.push((upstream.name().to_string(), template.uri_template.clone()));
                templates.push(Listed {
                    server: upstream.name().to_string(),
                    name: template.uri_template.clone(),
                    item: template,
                });
            }
        }
        *lock(&self.routes.templates) = routes;
        templates
    }

    /// The servers to try for `resources/read` of `uri`, best first: the
    /// server whose listing named it; else the servers with a matching
    /// template; else every resource server in config order. Only names:
    /// the broker decides which of them the caller may reach.
    pub async fn resource_servers(&self, uri: &str) -> Vec<String> {
        let mut server = lock(&self.routes.resources).get(uri).cloned();
        if server.is_none() {
            self.list_resources().await;
            server = lock(&self.routes.resources).get(uri).cloned();
        }
        if let Some(server) = server
            && self.upstream(&server).is_some()
        {
            return vec![server];
        }
        let resource_servers: Vec<String> = self
            .declaring(|c| c.resources.is_some())
            .iter()
            .map(|u| u.name().to_string())
            .collect();
        if resource_servers.len() <= 1 {
            return resource_servers;
        }
        if lock(&self.routes.templates).is_empty() {
            self.list_resource_templates().await;
        }
        let matching: Vec<String> = lock(&self.routes.templates)
            .iter()
            .filter(|(_, template)| template_matches(template, uri))
            .map(|(server, _)| server.clone())
            .collect();
        let mut ordered: Vec<String> = Vec::new();
        for server in resource_servers
            .iter()
            .filter(|s| matching.contains(s))
            .chain(resource_servers.iter())
        {
            if !ordered.contains(server) {
                ordered.push(server.clone());
            }
        }
        ordered
    }

    /// The server whose resource template is `uri_template`, if any.
    pub async fn template_server(&self, uri_template: &str) -> Option<String> {
        let find = || {
            lock(&self.routes.templates)
                .iter()
                .find(|(_, t)| t == uri_template)
                .map(|(s, _)| s.clone())
        };
        match find() {
            Some(s) => Some(s),
            None => {
                self.list_resource_templates().await;
                find()
            }
        }
    }
}

/// Whether `uri` could be an expansion of the RFC 6570 `template`. Simple
/// `{var}` matches one or more characters other than `/`, `?` and `#`;
/// reserved (`{+var}`, `{#var}`) and path (`{/var}`) expansions also match
/// `/`; query forms (`{?a,b}`, `{&c}`) match the rest of the URI, or nothing.
pub fn template_matches(template: &str, uri: &str) -> bool {
    #[derive(Debug)]
    enum Part<'a> {
        Literal(&'a str),
        Var { slash: bool, rest: bool },
    }
    let mut parts = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            parts.push(Part::Literal(&rest[..open]));
        }
        let Some(close) = rest[open..].find('}') else {
            return false;
        };
        let expr = &rest[open + 1..open + close];
        parts.push(match expr.chars().next() {
            Some('+') | Some('#') | Some('/') => Part::Var {
                slash: true,
                rest: false,
            },
            Some('?') | Some('&') => Part::Var {
                slash: true,
                rest: true,
            },
            _ => Part::Var {
                slash: false,
                rest: false,
            },
        });
        rest = &rest[open + close + 1..];
    }
    if !rest.is_empty() {
        parts.push(Part::Literal(rest));
    }

    fn go(parts: &[Part<'_>], uri: &str) -> bool {
        match parts.split_first() {
            None => uri.is_empty(),
            Some((Part::Literal(lit), tail)) => {
                uri.strip_prefix(lit).is_some_and(|after| go(tail, after))
            }
            Some((Part::Var { rest: true, .. }, tail)) => tail.is_empty(),
            Some((Part::Var { slash, .. }, tail)) => {
                for (i, c) in uri.char_indices() {
                    if c == '?' || c == '#' || (!slash && c == '/') {
                        break;
                    }
                    if go(tail, &uri[i + c.len_utf8()..]) {
                        return true;
                    }
                }
                false
            }
        }
    }
    go(&parts, uri)
}

#[cfg(test)]
mod tests {
    use super::template_matches;

    #[test]
    fn templates_match_their_expansions_only() {
        assert!(template_matches(
            "test://template/{id}/data",
            "test://template/123/data"
        ));
        assert!(!template_matches(
            "test://template/{id}/data",
            "test://template//data"
        ));
        assert!(!template_matches(
            "test://template/{id}/data",
            "test://template/1/2/data"
        ));
        assert!(!template_matches(
            "test://template/{id}/data",
            "test://static-text"
        ));
        assert!(template_matches("file:///{+path}", "file:///a/b/c.txt"));
        assert!(template_matches(
            "search://q{?term,limit}",
            "search://q?term=x"
        ));
        assert!(template_matches("search://q{?term,limit}", "search://q"));
        assert!(template_matches("a://{x}-{y}", "a://1-2"));
        assert!(!template_matches("a://{x", "a://1"));
    }
}
