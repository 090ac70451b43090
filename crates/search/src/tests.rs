//! Behaviour of the public API on small hand-made catalogs.

use super::*;

fn tool(server: &str, name: &str, description: &str) -> ToolDoc {
    ToolDoc {
        id: format!("{server}__{name}"),
        server: server.to_string(),
        server_description: String::new(),
        name: name.to_string(),
        title: None,
        description: description.to_string(),
        params: Vec::new(),
    }
}

fn catalog() -> SearchIndex {
    let mut time = tool(
        "time",
        "get_current_time",
        "Get the current time in a timezone.",
    );
    time.params = vec![(
        "timezone".into(),
        "IANA timezone name, e.g. Asia/Tokyo".into(),
    )];
    let mut github = tool(
        "github",
        "create_issue",
        "Open a new issue in a repository.",
    );
    github.server_description = "GitHub API: repositories, issues, pull requests".into();
    SearchIndex::build(vec![
        time,
        tool("time", "convert_time", "Convert a time between timezones."),
        github,
        tool(
            "github",
            "listIssues",
            "List issues of a repository, newest first.",
        ),
        tool("github", "create_pull_request", "Open a pull request."),
        tool(
            "fs",
            "read_file",
            "Read the complete contents of a file from disk.",
        ),
        tool(
            "fs",
            "write_file",
            "Create or overwrite a file with new content.",
        ),
        tool("fs", "list_directory", "List the entries of a directory."),
        tool(
            "arxiv",
            "search_papers",
            "Search arXiv for papers matching a query.",
        ),
        tool(
            "weather",
            "get_forecast",
            "Weather forecast for a city for the next days.",
        ),
    ])
}

fn ids(hits: &[Hit]) -> Vec<&str> {
    hits.iter().map(|h| h.id.as_str()).collect()
}

const ALL: &dyn Fn(&ToolDoc) -> bool = &|_| true;

#[test]
fn obvious_match_ranks_first() {
    let index = catalog();
    let cases = [
        (
            "what time is it in Tokyo right now?",
            "time__get_current_time",
        ),
        (
            "open a github issue about the crash",
            "github__create_issue",
        ),
        ("list the issues of my repository", "github__listIssues"),
        ("read the contents of /etc/hosts", "fs__read_file"),
        ("write this text to a new file", "fs__write_file"),
        ("find recent papers on retrieval", "arxiv__search_papers"),
        (
            "Will it rain in Paris tomorrow? Check the weather forecast.",
            "weather__get_forecast",
        ),
        ("getCurrentTime", "time__get_current_time"),
    ];
    for (query, want) in cases {
        let hits = index.search(query, 3, ALL);
        assert_eq!(
            hits.first().map(|h| h.id.as_str()),
            Some(want),
            "{query}: {hits:?}"
        );
    }
}

#[test]
fn scores_descend_and_ties_break_by_id() {
    let docs = ["c", "a", "b"].map(|s| tool(s, "same", "identical text"));
    let index = SearchIndex::build(docs.to_vec());
    let hits = index.search("identical", 10, ALL);
    assert_eq!(ids(&hits), ["a__same", "b__same", "c__same"]);

    let hits = catalog().search("file directory list", 10, ALL);
    assert!(hits.windows(2).all(|w| w[0].score >= w[1].score));
}

#[test]
fn filter_never_leaks_and_still_fills_the_limit() {
    let docs: Vec<ToolDoc> = (0..40)
        .map(|i| {
            tool(
                &format!("s{i:02}"),
                "search",
                &format!("search documents {i}"),
            )
        })
        .collect();
    let index = SearchIndex::build(docs);
    let visible = |d: &ToolDoc| d.server.ends_with(['1', '3', '5', '7', '9']);
    for limit in [1, 5, 10, 20, 25] {
        let hits = index.search("search documents", limit, &visible);
        assert_eq!(hits.len(), limit.min(20), "limit {limit}");
        assert!(hits.iter().all(|h| visible(index.doc(&h.id).unwrap())));
    }
    let hits = index.search_regex("search", 10, &visible).unwrap();
    assert_eq!(hits.len(), 10);
    assert!(hits.iter().all(|h| visible(index.doc(&h.id).unwrap())));
    assert!(index.search("search", 10, &|_| false).is_empty());
}

#[test]
fn hidden_best_match_gives_way_to_visible_ones() {
    let index = catalog();
    let hide_github = |d: &ToolDoc| d.server != "github";
    let hits = index.search("create github issue", 5, &hide_github);
    assert!(!hits.is_empty());
    assert!(
        hits.iter().all(|h| !h.id.starts_with("github__")),
        "{hits:?}"
    );
}

#[test]
fn queries_without_known_terms_find_nothing() {
    let index = catalog();
    assert!(index.search("", 10, ALL).is_empty());
    assert!(index.search("the and of to", 10, ALL).is_empty());
    assert!(index.search("xyzzy", 10, ALL).is_empty());
    assert!(index.search("file", 0, ALL).is_empty());
    assert!(
        SearchIndex::build(Vec::new())
            .search("file", 10, ALL)
            .is_empty()
    );
}

#[test]
fn cjk_text_is_searchable() {
    let mut bazi = tool("bazi", "getBaziDetail", "根据时间获取八字信息");
    bazi.server = "Bazi MCP (八字 MCP)".into();
    let index = SearchIndex::build(vec![bazi, tool("time", "now", "current time")]);
    let hits = index.search("What are the 八字 of a boy born in 2008?", 5, ALL);
    assert_eq!(ids(&hits), ["bazi__getBaziDetail"]);
}

#[test]
fn duplicate_ids_keep_the_first() {
    let index = SearchIndex::build(vec![tool("a", "x", "first"), tool("a", "x", "second")]);
    assert_eq!(index.len(), 1);
    assert_eq!(index.doc("a__x").unwrap().description, "first");
    assert!(index.search("second", 10, ALL).is_empty());
    assert!(index.doc("a__y").is_none());
}

#[test]
fn regex_matches_names_before_descriptions() {
    let index = catalog();
    let hits = index.search_regex("issue", 10, ALL).unwrap();
    // Name matches first (id order on ties), then the description-only one.
    assert_eq!(ids(&hits), ["github__create_issue", "github__listIssues"]);

    let hits = index.search_regex(r"^(read|write)_file$", 10, ALL).unwrap();
    assert_eq!(ids(&hits), ["fs__read_file", "fs__write_file"]);

    // Description match, then a match in the server's description only.
    let hits = index.search_regex("pull request", 10, ALL).unwrap();
    assert_eq!(
        ids(&hits),
        ["github__create_pull_request", "github__create_issue"]
    );
    assert!(
        index
            .search_regex("(?-i)ISSUE", 10, ALL)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn regex_refuses_oversized_patterns() {
    let index = catalog();
    let long = "a".repeat(MAX_PATTERN_LEN + 1);
    let err = index.search_regex(&long, 10, ALL).unwrap_err();
    assert_eq!(
        err,
        SearchError::PatternTooLong {
            len: MAX_PATTERN_LEN + 1,
            max: MAX_PATTERN_LEN
        }
    );
    assert!(err.to_string().contains("the limit is 256"), "{err}");
    assert!(
        index
            .search_regex(&"a".repeat(MAX_PATTERN_LEN), 10, ALL)
            .is_ok()
    );

    // Short, but its compiled program would be huge.
    let err = index.search_regex(r"(\w{100}){100}", 10, ALL).unwrap_err();
    assert!(
        matches!(err, SearchError::PatternTooComplex { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("too complex"), "{err}");

    let err = index.search_regex("(unclosed", 10, ALL).unwrap_err();
    assert!(matches!(err, SearchError::InvalidPattern(_)), "{err:?}");
}

#[test]
fn suggests_close_names() {
    let index = catalog();
    assert_eq!(index.suggest("serach_papers", 3)[0], "arxiv__search_papers");
    assert_eq!(
        index.suggest("github__create_isue", 1),
        ["github__create_issue"]
    );
    assert_eq!(index.suggest("READ_FILE", 1), ["fs__read_file"]);
    // Containment: a bare fragment of a name.
    let s = index.suggest("time", 5);
    assert!(s.contains(&"time__convert_time".to_string()), "{s:?}");
    assert!(index.suggest("zzzzzzzz", 5).is_empty());
    assert!(index.suggest("", 5).is_empty());
    assert_eq!(index.suggest("file", 2).len(), 2);
}

#[test]
fn strategy_parses_and_serializes_lowercase() {
    assert_eq!("bm25".parse::<Strategy>().unwrap(), Strategy::Bm25);
    assert_eq!(" Regex ".parse::<Strategy>().unwrap(), Strategy::Regex);
    let err = "fuzzy".parse::<Strategy>().unwrap_err();
    assert!(
        err.to_string().contains("expected \"bm25\" or \"regex\""),
        "{err}"
    );
    assert_eq!(
        serde_json::to_string(&Strategy::Regex).unwrap(),
        "\"regex\""
    );
    assert_eq!(
        serde_json::from_str::<Strategy>("\"bm25\"").unwrap(),
        Strategy::Bm25
    );
    assert_eq!(Strategy::default().to_string(), "bm25");

    let index = catalog();
    let hits = index.query(Strategy::Regex, "forecast", 5, ALL).unwrap();
    assert_eq!(ids(&hits), ["weather__get_forecast"]);
}

#[test]
fn params_come_from_schema_properties() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File to read"},
            "encoding": {"type": "string", "title": "Text encoding"},
            "raw": {"type": "boolean"}
        }
    });
    assert_eq!(
        ToolDoc::params_from_schema(&schema),
        [
            ("path".to_string(), "File to read".to_string()),
            ("encoding".to_string(), "Text encoding".to_string()),
            ("raw".to_string(), String::new()),
        ]
    );
    assert!(ToolDoc::params_from_schema(&serde_json::Value::Null).is_empty());
}
