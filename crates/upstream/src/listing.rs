use std::collections::HashSet;

use rmcp::{
    RoleClient,
    model::{PaginatedRequestParams, Tool},
    service::Peer,
};

use crate::UpstreamError;

/// Who may reuse a listing (SEP-2549). A missing scope is treated as private.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheScope {
    Public,
    Private,
}

/// Every tool of one upstream, merged over all pages, with the merged cache hint.
#[derive(Debug, Clone)]
pub struct ToolListing {
    pub tools: Vec<Tool>,
    /// The smallest `ttlMs` of any page; `None` if the upstream sent none.
    pub ttl_ms: Option<u64>,
    pub scope: CacheScope,
    pub pages: usize,
}

/// Page through `tools/list`. rmcp's own `list_all_tools` trusts the upstream's
/// cursors; a lying server could loop forever, so we stop on a repeated cursor
/// and after `max_pages`.
pub(crate) async fn list_all_tools(
    server: &str,
    peer: &Peer<RoleClient>,
    max_pages: usize,
) -> Result<ToolListing, UpstreamError> {
    let mut tools = Vec::new();
    let mut seen = HashSet::new();
    let mut cursor: Option<String> = None;
    let mut ttl_ms: Option<u64> = None;
    let mut any_missing_ttl = false;
    let mut scope = CacheScope::Public;
    let mut pages = 0;
    loop {
        if pages == max_pages {
            return Err(UpstreamError::TooManyPages {
                server: server.to_string(),
                max_pages,
            });
        }
        let params = cursor
            .clone()
            .map(|c| PaginatedRequestParams::default().with_cursor(Some(c)));
        let page = peer
            .list_tools(params)
            .await
            .map_err(|e| UpstreamError::Protocol {
                server: server.to_string(),
                message: format!("tools/list failed: {e}"),
            })?;
        pages += 1;
        match page.ttl_ms {
            Some(t) => ttl_ms = Some(ttl_ms.map_or(t, |m| m.min(t))),
            None => any_missing_ttl = true,
        }
        if !matches!(page.cache_scope, Some(rmcp::model::CacheScope::Public)) {
            scope = CacheScope::Private;
        }
        tools.extend(page.tools);
        match page.next_cursor {
            None => break,
            Some(next) => {
                if !seen.insert(next.clone()) {
                    return Err(UpstreamError::CursorLoop {
                        server: server.to_string(),
                        cursor: next,
                        page: pages,
                    });
                }
                cursor = Some(next);
            }
        }
    }
    Ok(ToolListing {
        tools,
        ttl_ms: if any_missing_ttl { None } else { ttl_ms },
        scope,
        pages,
    })
}
