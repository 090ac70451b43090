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

    fn upstream(&self, server: &str) -> Option<Arc<Upstream>> {
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

    /// Every prompt of every connected server, under its exposed name. With
    /// unqualified names the first server (in config order) wins a clash.
    pub async fn list_prompts(&self) -> Vec<Prompt> {
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
                prompt.name = exposed;
                prompts.push(prompt);
            }
        }
        *lock(&self.routes.prompts) = routes;
        prompts
    }

    /// The upstream serving the prompt exposed as `name`, and the prompt's
    /// upstream name. Lists prompts again if `name` was not in the last listing.
    pub async fn prompt_target(&self, name: &str) -> Option<(Arc<Upstream>, String)> {
        let known = lock(&self.routes.prompts).get(name).cloned();
        let (server, upstream_name) = match known {
            Some(route) => route,
            None => {
                self.list_prompts().await;
                match lock(&self.routes.prompts).get(name).cloned() {
                    Some(route) => route,
                    // A qualified name of a prompt we have not listed (yet).
                    None if self.qualify_names() => {
                        split_qualified(name).map(|(s, p)| (s.to_string(), p.to_string()))?
                    }
                    None => return None,
                }
            }
        };
        let upstream = self.upstream(&server)?;
        Some((upstream, upstream_name))
    }

    /// Every resource of every connected server; URIs are left as they are.
    pub async fn list_resources(&self) -> Vec<Resource> {
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
                resources.push(resource);
            }
        }
        *lock(&self.routes.resources) = routes;
        resources
    }

    /// Every resource template of every connected server.
    pub async fn list_resource_templates(&self) -> Vec<ResourceTemplate> {
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
                templates.push(template);
            }
        }
        *lock(&self.routes.templates) = routes;
        templates
    }

    /// The servers to try for `resources/read` of `uri`, best first: the
    /// server whose listing named it; else the servers with a matching
    /// template; else every resource server in config order.
    pub async fn resource_targets(&self, uri: &str) -> Vec<Arc<Upstream>> {
        let mut server = lock(&self.routes.resources).get(uri).cloned();
        if server.is_none() {
            self.list_resources().await;
            server = lock(&self.routes.resources).get(uri).cloned();
        }
        if let Some(server) = server
            && let Some(upstream) = self.upstream(&server)
        {
            return vec![upstream];
        }
        let resource_servers = self.declaring(|c| c.resources.is_some());
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
        let mut ordered: Vec<Arc<Upstream>> = Vec::new();
        for upstream in resource_servers
            .iter()
            .filter(|u| matching.iter().any(|s| s == u.name()))
            .chain(resource_servers.iter())
        {
            if !ordered.iter().any(|u| u.name() == upstream.name()) {
                ordered.push(Arc::clone(upstream));
            }
        }
        ordered
    }

    /// The server whose resource template is `uri_template`, if any.
    pub async fn template_target(&self, uri_template: &str) -> Option<Arc<Upstream>> {
        let find = || {
            lock(&self.routes.templates)
                .iter()
                .find(|(_, t)| t == uri_template)
                .map(|(s, _)| s.clone())
        };
        let server = match find() {
            Some(s) => s,
            None => {
                self.list_resource_templates().await;
                find()?
            }
        };
        self.upstream(&server)
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
