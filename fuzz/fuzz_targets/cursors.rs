//! Upstream pagination: any sequence of pages and cursors ends, within the
//! page cap, without a repeated cursor.
#![no_main]

use libfuzzer_sys::fuzz_target;
use manifold_upstream::{UpstreamError, list_tools_from_pages};
use rmcp::model::ListToolsResult;

const MAX_PAGES: usize = 20;

fuzz_target!(|data: &[u8]| {
    // Each byte is one page: 0 ends the listing, else the next cursor is that
    // byte's value modulo a small alphabet, so repeats are common.
    let pages: Vec<ListToolsResult> = data
        .iter()
        .map(|b| {
            let mut page = ListToolsResult::default();
            page.next_cursor = (*b != 0).then(|| format!("c{}", b % 23));
            page
        })
        .collect();
    match list_tools_from_pages(pages, MAX_PAGES) {
        Ok(listing) => {
            assert!(listing.pages <= MAX_PAGES);
            assert!(listing.pages <= data.len());
        }
        Err(UpstreamError::CursorLoop { page, .. }) => assert!(page <= MAX_PAGES),
        Err(UpstreamError::TooManyPages { max_pages, .. }) => assert_eq!(max_pages, MAX_PAGES),
        // The pages ran out: the fuzzer's "connection closed".
        Err(UpstreamError::Protocol { .. }) => {}
        Err(other) => panic!("unexpected {other}"),
    }
});
