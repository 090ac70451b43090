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
        err.to_string()
            .contains("expected \"bm25\", \"regex\", \"embedding\", \"hybrid\" or \"rerank\""),
        "{err}"
    );
    for s in Strategy::ALL {
        assert_eq!(s.to_string().parse::<Strategy>().unwrap(), s);
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, format!("\"{s}\""));
    }
    assert_eq!(
        serde_json::to_string(&Strategy::Regex).unwrap(),
        "\"regex\""
    );
    assert_eq!(
        serde_json::from_str::<Strategy>("\"bm25\"").unwrap(),
        Strategy::Bm25
    );
    assert_eq!(Strategy::default().to_string(), "hybrid");

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

/// A stand-in model: each word (after the crate's own analysis) lights one
/// of 64 dimensions. Enough to test ranking plumbing without a real model.
struct WordHash {
    calls: std::sync::atomic::AtomicUsize,
}

impl WordHash {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            calls: std::sync::atomic::AtomicUsize::new(0),
        })
    }
}

impl Embedder for WordHash {
    fn model_id(&self) -> &str {
        "word-hash-64"
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(texts
            .iter()
            .map(|t| {
                let mut v = vec![0.0f32; 64];
                let mut words = Vec::new();
                analyze(t, &mut words);
                for w in words {
                    let h = w
                        .bytes()
                        .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(b.into()));
                    v[(h % 64) as usize] += 1.0;
                }
                v
            })
            .collect())
    }
}

struct Failing;

impl Embedder for Failing {
    fn model_id(&self) -> &str {
        "failing"
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.len() > 1 {
            Ok(texts.iter().map(|_| vec![1.0, 0.0]).collect())
        } else {
            Err(EmbedError::new("endpoint down"))
        }
    }
}

#[test]
fn embedding_and_hybrid_need_vectors() {
    let index = catalog();
    assert!(!index.has_embeddings());
    assert_eq!(
        index.query(Strategy::Embedding, "weather", 5, ALL),
        Err(SearchError::NoEmbeddings)
    );
    // Hybrid without vectors is BM25F: a safe default strategy.
    assert_eq!(
        index.query(Strategy::Hybrid, "weather forecast", 5, ALL),
        Ok(index.search("weather forecast", 5, ALL))
    );
}

#[test]
fn embedding_ranks_by_cosine_and_fills_the_limit() {
    let model = WordHash::new();
    let index = catalog().with_embeddings(model.clone()).unwrap();
    assert!(index.has_embeddings());
    // All tools embedded in one call.
    assert_eq!(model.calls.load(std::sync::atomic::Ordering::Relaxed), 1);
    let hits = index
        .search_embedding("weather forecast city", 3, ALL)
        .unwrap();
    assert_eq!(hits[0].id, "weather__get_forecast");
    assert_eq!(hits.len(), 3);
    assert!(hits.windows(2).all(|w| w[0].score >= w[1].score));
    // Every tool has a score, so even an unrelated query fills the limit.
    assert_eq!(index.search_embedding("xyzzy", 4, ALL).unwrap().len(), 4);
    assert!(index.search_embedding("xyzzy", 0, ALL).unwrap().is_empty());
}

#[test]
fn hybrid_returns_only_visible_tools() {
    let index = catalog().with_embeddings(WordHash::new()).unwrap();
    let hits = index
        .query(Strategy::Hybrid, "open a github issue", 5, ALL)
        .unwrap();
    assert_eq!(hits[0].id, "github__create_issue");

    let hide_github = |d: &ToolDoc| d.server != "github";
    for strategy in [Strategy::Hybrid, Strategy::Embedding] {
        for limit in [1, 3, 7, 20] {
            let hits = index
                .query(strategy, "open a github issue", limit, &hide_github)
                .unwrap();
            assert!(!hits.is_empty());
            assert!(
                hits.iter().all(|h| !h.id.starts_with("github__")),
                "{strategy} {limit}: {hits:?}"
            );
            assert!(hits.len() <= limit);
        }
        assert!(
            index
                .query(strategy, "issue", 5, &|_| false)
                .unwrap()
                .is_empty()
        );
    }
    // Ranks are taken among visible tools: hiding a tool does not change the
    // order of the others.
    let only_fs = |d: &ToolDoc| d.server == "fs";
    let hits = index
        .query(Strategy::Hybrid, "read a file", 10, &only_fs)
        .unwrap();
    assert_eq!(hits[0].id, "fs__read_file");
    assert!(hits.iter().all(|h| h.id.starts_with("fs__")));
}

#[test]
fn hybrid_fusion_variants_are_deterministic() {
    for params in [
        HybridParams::default(),
        HybridParams {
            fusion: Fusion::Weighted,
            ..HybridParams::default()
        },
        HybridParams {
            server_boost: 0.5,
            depth: 3,
            ..HybridParams::default()
        },
    ] {
        let index = catalog()
            .with_embeddings(WordHash::new())
            .unwrap()
            .with_hybrid_params(params);
        let a = index
            .search_hybrid("list directory files", 10, ALL)
            .unwrap();
        let b = index
            .search_hybrid("list directory files", 10, ALL)
            .unwrap();
        assert_eq!(a, b);
        assert_eq!(a[0].id, "fs__list_directory", "{params:?}: {a:?}");
        assert!(a.windows(2).all(|w| w[0].score >= w[1].score));
    }
}

#[test]
fn a_failing_query_embedding_is_an_error_not_a_panic() {
    let index = catalog().with_embeddings(Arc::new(Failing)).unwrap();
    for strategy in [Strategy::Embedding, Strategy::Hybrid] {
        let err = index.query(strategy, "weather", 5, ALL).unwrap_err();
        assert_eq!(err, SearchError::Embedding("endpoint down".into()));
        assert!(
            err.to_string().contains("bm25 strategy still works"),
            "{err}"
        );
    }
}

#[test]
fn vectors_are_unit_length_and_dot_is_exact() {
    let v = embed::normalized(vec![3.0, 4.0]);
    assert_eq!(v, [0.6, 0.8]);
    assert_eq!(embed::normalized(vec![0.0; 3]), [0.0; 3]);
    let a: Vec<f32> = (0..19).map(|i| i as f32).collect();
    assert_eq!(
        embed::dot(&a, &a),
        (0..19).map(|i| (i * i) as f32).sum::<f32>()
    );
}

#[test]
fn embedding_text_reads_like_a_sentence() {
    let mut t = tool("github", "listIssues", "List issues of a repository.");
    assert_eq!(
        embedding_text(&t),
        "github: list issues: List issues of a repository."
    );
    t.title = Some("List issues".into());
    assert_eq!(
        embedding_text(&t),
        "github: list issues: List issues: List issues of a repository."
    );
    // A one-tool server named like its tool is not said twice.
    let solo = tool("researchhelper", "ResearchHelper", "Find papers.");
    assert_eq!(embedding_text(&solo), "research helper: Find papers.");
}

/// A generated catalog: `servers` servers of 8 tools, with `revision` in the
/// descriptions of the tools of server `changed`.
fn servers(servers: usize, changed: usize, revision: u32) -> Vec<ToolDoc> {
    let verbs = [
        "read", "write", "list", "search", "create", "delete", "move", "watch",
    ];
    let mut docs = Vec::new();
    for s in 0..servers {
        for (t, verb) in verbs.iter().enumerate() {
            let mut d = tool(
                &format!("srv{s}"),
                &format!("{verb}_item{t}"),
                &format!("{verb} items of kind {s} and topic {}", (s * 7 + t) % 13),
            );
            if s == changed {
                let word = [
                    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf",
                ];
                let word = word[revision as usize % word.len()];
                d.description.push_str(&format!(" zq{word} extra"));
            }
            docs.push(d);
        }
    }
    docs
}

fn all_scores(index: &SearchIndex, queries: &[&str]) -> Vec<Vec<Hit>> {
    queries
        .iter()
        .map(|q| index.search(q, 1000, &|_| true))
        .collect()
}

#[test]
fn a_cached_rebuild_ranks_exactly_as_a_fresh_one() {
    let queries = [
        "read items",
        "revision3 extra",
        "topic 5 watch",
        "kind 2 delete",
    ];
    let mut cache = Bm25Cache::default();
    for revision in 0..5 {
        let docs = servers(20, revision as usize % 3, revision);
        let cached = SearchIndex::build_cached(docs.clone(), &Bm25Params::default(), &mut cache);
        let fresh = SearchIndex::build(docs);
        assert_eq!(all_scores(&cached, &queries), all_scores(&fresh, &queries));
    }
    // The terms of an earlier revision are still interned but match nothing.
    let docs = servers(20, 0, 6);
    let index = SearchIndex::build_cached(docs, &Bm25Params::default(), &mut cache);
    let stale = index.search("zqdelta", 10, &|_| true);
    assert!(stale.is_empty(), "{stale:?}");
    assert_eq!(index.search("zqgolf", 10, &|_| true).len(), 8);
}

#[test]
fn the_analysis_cache_stays_bounded_when_tools_keep_changing() {
    let mut cache = Bm25Cache::default();
    // A server whose tools are new on every listing (a rug pull), 3,000 times.
    for revision in 0..3_000u32 {
        let mut docs = servers(4, 99, 0);
        for d in docs.iter_mut().take(8) {
            d.id = format!("{}_{revision}", d.id);
            d.description = format!("brand new words w{revision}a w{revision}b");
        }
        SearchIndex::build_cached(docs, &Bm25Params::default(), &mut cache);
        assert!(
            cache.len() <= 2 * 32 + 1024 + 8,
            "{} documents kept",
            cache.len()
        );
    }
    assert!(cache.terms_len() <= 4 * 60 + 100_000);
}

/// Counts the texts it embeds, under a model id of the test's choice.
struct Counting {
    id: &'static str,
    texts: std::sync::atomic::AtomicUsize,
}

impl Counting {
    fn new(id: &'static str) -> Arc<Self> {
        Arc::new(Self {
            id,
            texts: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    fn texts(&self) -> usize {
        self.texts.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Embedder for Counting {
    fn model_id(&self) -> &str {
        self.id
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.texts
            .fetch_add(texts.len(), std::sync::atomic::Ordering::Relaxed);
        WordHash::new().embed(texts)
    }
}

#[test]
fn a_rebuild_embeds_only_the_changed_tools_and_ranks_as_a_full_build() {
    let model = Counting::new("word-hash-64");
    let docs = servers(20, 99, 0);
    let before = SearchIndex::build(docs.clone())
        .with_embeddings(model.clone())
        .unwrap();
    assert_eq!(model.texts(), 160);

    let mut changed = docs;
    for d in changed.iter_mut().filter(|d| d.server == "srv3") {
        d.description = format!("{} now also archives old items", d.description);
    }
    let after = SearchIndex::build(changed.clone())
        .with_embeddings_from(model.clone(), &before)
        .unwrap();
    assert_eq!(model.texts(), 160 + 8, "only srv3's 8 tools are embedded");

    let full = SearchIndex::build(changed.clone())
        .with_embeddings(WordHash::new())
        .unwrap();
    for q in [
        "archives old items",
        "read items of kind 3",
        "watch topic 5",
    ] {
        for strategy in [Strategy::Embedding, Strategy::Hybrid] {
            let a = after.query(strategy, q, 20, &|_| true).unwrap();
            let b = full.query(strategy, q, 20, &|_| true).unwrap();
            assert_eq!(a, b, "{strategy} {q}");
        }
    }

    // Vectors of another model are never reused.
    let other = Counting::new("another-model");
    SearchIndex::build(changed)
        .with_embeddings_from(other.clone(), &after)
        .unwrap();
    assert_eq!(other.texts(), 160);
}

#[test]
fn a_task_query_ranks_each_steps_tool_high_with_clauses() {
    let task = "Find papers on arXiv about retrieval models, then write the list into a new file. \
                Get the weather forecast for Berlin.";
    let params = HybridParams {
        clause_weight: 0.5,
        clause_embedding: true,
        ..HybridParams::default()
    };
    let embedder = WordHash::new();
    let index = catalog()
        .with_embeddings(embedder.clone())
        .unwrap()
        .with_hybrid_params(params);
    let before = embedder.calls.load(std::sync::atomic::Ordering::Relaxed);
    let hits = index.search_hybrid(task, 3, ALL).unwrap();
    let mut top = ids(&hits);
    top.sort_unstable();
    assert_eq!(
        top,
        [
            "arxiv__search_papers",
            "fs__write_file",
            "weather__get_forecast"
        ]
    );
    // The task and its three steps (WordHash has no batch path: one call each).
    assert_eq!(
        embedder.calls.load(std::sync::atomic::Ordering::Relaxed) - before,
        4
    );
    assert_eq!(hits, index.search_hybrid(task, 3, ALL).unwrap());
    // A one-step query is not split: the same ranking as without clauses.
    let plain = catalog().with_embeddings(WordHash::new()).unwrap();
    assert_eq!(
        index.search_hybrid("read a file", 5, ALL).unwrap(),
        plain.search_hybrid("read a file", 5, ALL).unwrap()
    );
}
