use std::{collections::HashSet, future::Future};

use rmcp::{
    ServiceError,
    model::{
        ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult,
        PaginatedRequestParams, Prompt, Resource, ResourceTemplate, Tool,
    },
};

use crate::UpstreamError;

/// Who may reuse a listing (SEP-2549). A missing scope is treated as private.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheScope {
    Public,
    Private,
}

/// Every item of one upstream listing, merged over all pages, with the merged
/// cache hint.
#[derive(Debug, Clone)]
pub struct Listing<T> {
    pub items: Vec<T>,
    /// The smallest `ttlMs` of any page; `None` if any page sent none.
    pub ttl_ms: Option<u64>,
    pub scope: CacheScope,
    pub pages: usize,
}

pub type ToolListing = Listing<Tool>;
pub type PromptListing = Listing<Prompt>;
pub type ResourceListing = Listing<Resource>;
pub type ResourceTemplateListing = Listing<ResourceTemplate>;

/// One page of a paginated list result.
pub(crate) trait Page {
    type Item;
    /// The MCP method, for error messages.
    const METHOD: &'static str;
    fn ttl_ms(&self) -> Option<u64>;
    fn public(&self) -> bool;
    fn into_parts(self) -> (Vec<Self::Item>, Option<String>);
}

macro_rules! page {
    ($result:ty, $item:ty, $field:ident, $method:literal) => {
        impl Page for $result {
            type Item = $item;
            const METHOD: &'static str = $method;
            fn ttl_ms(&self) -> Option<u64> {
                self.ttl_ms
            }
            fn public(&self) -> bool {
                matches!(self.cache_scope, Some(rmcp::model::CacheScope::Public))
            }
            fn into_parts(self) -> (Vec<$item>, Option<String>) {
                (self.$field, self.next_cursor)
            }
        }
    };
}

page!(ListToolsResult, Tool, tools, "tools/list");
page!(ListPromptsResult, Prompt, prompts, "prompts/list");
page!(ListResourcesResult, Resource, resources, "resources/list");
page!(
    ListResourceTemplatesResult,
    ResourceTemplate,
    resource_templates,
    "resources/templates/list"
);

/// [`list_all`] over `pages` served in order, as a (possibly lying) upstream
/// would; for fuzzing the cursor rules without a connection.
#[doc(hidden)]
#[allow(clippy::result_large_err)] // the error every listing returns
pub fn list_tools_from_pages(
    pages: Vec<ListToolsResult>,
    max_pages: usize,
) -> Result<ToolListing, UpstreamError> {
    use std::task::{Context, Poll, Waker};
    let mut pages = pages.into_iter();
    let listing = list_all::<ListToolsResult, _, _>("fuzz", max_pages, |_| {
        std::future::ready(pages.next().ok_or(ServiceError::TransportClosed))
    });
    let mut listing = std::pin::pin!(listing);
    match listing
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(result) => result,
        Poll::Pending => unreachable!("every page is ready at once"),
    }
}

/// Page through a list method with `fetch`. rmcp's own `list_all_*` helpers
/// trust the upstream's cursors; a lying server could loop forever, so we stop
/// on a repeated cursor and after `max_pages`.
pub(crate) async fn list_all<P, F, Fut>(
    server: &str,
    max_pages: usize,
    mut fetch: F,
) -> Result<Listing<P::Item>, UpstreamError>
where
    P: Page,
    F: FnMut(Option<PaginatedRequestParams>) -> Fut,
    Fut: Future<Output = Result<P, ServiceError>>,
{
    let mut items = Vec::new();
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
        let page = fetch(params).await.map_err(|e| UpstreamError::Protocol {
            server: server.to_string(),
            message: format!("{} failed: {e}", P::METHOD),
        })?;
        pages += 1;
        match page.ttl_ms() {
            Some(t) => ttl_ms = Some(ttl_ms.map_or(t, |m| m.min(t))),
            None => any_missing_ttl = true,
        }
        if !page.public() {
            scope = CacheScope::Private;
        }
        let (page_items, next_cursor) = page.into_parts();
        items.extend(page_items);
        match next_cursor {
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
    Ok(Listing {
        items,
        ttl_ms: if any_missing_ttl { None } else { ttl_ms },
        scope,
        pages,
    })
}
