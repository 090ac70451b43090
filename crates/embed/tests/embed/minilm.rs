//! The generic all-MiniLM-L6-v2 from the files that
//! `scripts/install-test-deps.sh` installs into `.venv` (its figures are
//! sentence-transformers'; the shipped tool model is tested at the end).
//! Without them the tests say so and pass, except under CI (`CI` set), where
//! a missing model is a failure.

use std::path::PathBuf;
use std::sync::Arc;

use manifold_embed::{CachedEmbedder, Embedder, MiniLm, resolve_generic_model_dir};
use manifold_search::{SearchIndex, Strategy, ToolDoc};

fn model_dir() -> Option<PathBuf> {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    match resolve_generic_model_dir(&[workspace]) {
        Ok(dir) => Some(dir),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn model() -> Option<Arc<MiniLm>> {
    let dir = model_dir()?;
    Some(Arc::new(MiniLm::load(&dir).expect("the model loads")))
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b))
}

#[test]
fn related_sentences_score_well_above_unrelated_ones() {
    let Some(model) = model() else { return };
    let v = model
        .embed(&[
            "A man is eating food.",
            "A man is eating a piece of bread.",
            "The stock market fell sharply today.",
            "Get the current weather forecast for a city",
            "Will it rain in Paris tomorrow?",
        ])
        .unwrap();
    assert!(v.iter().all(|x| x.len() == 384));
    let related = cosine(&v[0], &v[1]);
    let unrelated = cosine(&v[0], &v[2]);
    // sentence-transformers gives 0.755 and about 0.0 for these two pairs. A
    // padded-to-128 input without the attention mask gives 0.85+ for both.
    assert!((related - 0.755).abs() < 0.02, "related {related}");
    assert!(unrelated < 0.2, "unrelated {unrelated}");
    assert!(related - unrelated > 0.5);
    assert!(cosine(&v[3], &v[4]) > cosine(&v[3], &v[2]) + 0.2);
    // A batch gives the same vectors as one text at a time (padding is
    // masked), and the query path agrees with the batch path.
    let alone = model
        .embed_query("A man is eating a piece of bread.")
        .unwrap();
    assert!(cosine(&alone, &v[1]) > 0.9999, "{}", cosine(&alone, &v[1]));
}

/// Vectors that candle's BERT computed for the same model
/// (`scripts/reference-vectors.sh` writes them; it names candle's version).
struct Reference {
    texts: Vec<String>,
    vectors: Vec<Vec<f32>>,
}

fn candle_reference(dir: &std::path::Path) -> Reference {
    let doc: serde_json::Value =
        serde_json::from_str(include_str!("reference_vectors.json")).unwrap();
    // The reference is only a reference for the weights it was computed from.
    let weights = std::fs::read(dir.join("model.safetensors")).unwrap();
    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&weights));
    assert_eq!(
        doc["model_sha256"], sha,
        "the installed model is not the one the reference vectors were made from: rerun scripts/reference-vectors.sh"
    );
    Reference {
        texts: serde_json::from_value(doc["texts"].clone()).unwrap(),
        vectors: serde_json::from_value(doc["vectors"].clone()).unwrap(),
    }
}

#[test]
fn every_kernel_gives_candles_vectors() {
    let Some(dir) = model_dir() else { return };
    let Reference {
        texts,
        vectors: reference,
    } = candle_reference(&dir);
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    assert!(texts.len() >= 5 && reference.iter().all(|v| v.len() == 384));
    let kernels = MiniLm::kernels();
    assert!(kernels.contains(&"portable"), "{kernels:?}");
    for kernel in kernels {
        let model = MiniLm::load_with_kernel(&dir, kernel).unwrap();
        assert_eq!(model.kernel(), kernel);
        // f16 weights with f32 arithmetic are within 1e-5 of candle's f32;
        // AMX multiplies bfloat16 (8 significant bits) and adds in f32.
        let floor = if kernel == "amx" { 0.9999 } else { 0.99999 };
        let ours = model.embed(&texts).unwrap();
        assert_eq!(ours.len(), reference.len());
        for ((text, a), b) in texts.iter().zip(&ours).zip(&reference) {
            assert_eq!(a.len(), 384);
            let c = cosine(a, b);
            assert!(
                c > floor,
                "{kernel}: {c} for {:?}",
                &text[..text.len().min(40)]
            );
        }
        // One text alone takes the threaded path; it must agree as well.
        let alone = model.embed_query(texts[2]).unwrap();
        assert!(cosine(&alone, &reference[2]) > floor, "{kernel}");
    }
    let unknown = MiniLm::load_with_kernel(&dir, "tpu").err().unwrap();
    assert!(unknown.0.contains("no \"tpu\" kernel"), "{unknown}");
}

#[test]
fn every_kernel_agrees_with_the_portable_one_at_every_length() {
    let Some(dir) = model_dir() else { return };
    let portable = MiniLm::load_with_kernel(&dir, "portable").unwrap();
    let words = "find the open pull requests that touch the billing service and list them";
    // 1 to 16 words: every remainder of the kernels' row blocks, alone (the
    // threaded path) and in one batch.
    let texts: Vec<String> = (1..=16)
        .map(|n| {
            words
                .split(' ')
                .cycle()
                .take(n)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let expected = portable.embed(&texts).unwrap();
    for kernel in MiniLm::kernels() {
        let floor = if kernel == "amx" { 0.9999 } else { 0.99999 };
        let model = MiniLm::load_with_kernel(&dir, kernel).unwrap();
        let batch = model.embed(&texts).unwrap();
        for ((text, want), got) in texts.iter().zip(&expected).zip(&batch) {
            let alone = model.embed_query(text).unwrap();
            assert!(cosine(&alone, want) > floor, "{kernel}, alone: {text:?}");
            assert!(cosine(got, want) > floor, "{kernel}, in a batch: {text:?}");
        }
    }
}

#[test]
fn the_model_id_names_the_arithmetic() {
    let Some(dir) = model_dir() else { return };
    let ids: Vec<String> = MiniLm::kernels()
        .into_iter()
        .map(|k| {
            MiniLm::load_with_kernel(&dir, k)
                .unwrap()
                .model_id()
                .to_string()
        })
        .collect();
    // Cached tool vectors are keyed by the id: every f16 kernel shares one,
    // and AMX's bfloat16 vectors get their own.
    let kinds: std::collections::BTreeSet<&String> = ids.iter().collect();
    let expected = if MiniLm::kernels().contains(&"amx") {
        2
    } else {
        1
    };
    assert_eq!(kinds.len(), expected, "{ids:?}");
}

#[test]
fn a_second_build_reuses_every_cached_vector() {
    let Some(model) = model() else { return };
    let cache = tempfile::tempdir().unwrap();
    let tools = || {
        [
            ("weather", "get_forecast", "Weather forecast for a city."),
            ("fs", "read_file", "Read the complete contents of a file."),
            ("arxiv", "search_papers", "Search arXiv for papers."),
        ]
        .map(|(server, name, description)| ToolDoc {
            id: format!("{server}__{name}"),
            server: server.into(),
            name: name.into(),
            description: description.into(),
            ..ToolDoc::default()
        })
        .to_vec()
    };
    let first = Arc::new(CachedEmbedder::new(model.clone(), cache.path()).unwrap());
    let index = SearchIndex::build(tools())
        .with_embeddings(first.clone())
        .unwrap();
    assert_eq!((first.embedded(), first.reused()), (3, 0));
    let hits = index
        .query(Strategy::Embedding, "will it rain tomorrow", 1, &|_| true)
        .unwrap();
    assert_eq!(hits[0].id, "weather__get_forecast");

    // A restart: a new process would build a new embedder over the same dir.
    let second = Arc::new(CachedEmbedder::new(model, cache.path()).unwrap());
    let again = SearchIndex::build(tools())
        .with_embeddings(second.clone())
        .unwrap();
    assert_eq!((second.embedded(), second.reused()), (0, 3));
    let hits = again
        .query(Strategy::Hybrid, "will it rain tomorrow", 1, &|_| true)
        .unwrap();
    assert_eq!(hits[0].id, "weather__get_forecast");
}

#[test]
fn the_shipped_tool_model_is_named_apart_and_matches_tasks_to_tools() {
    let dir =
        manifold_embed::shipped_model_dir().expect("models/tool-minilm-l6 ships in the repository");
    let tool = MiniLm::load(&dir).expect("the tool model loads");
    // Vectors of different models must never share a cache entry.
    assert!(
        tool.model_id().starts_with("tool-minilm-l6/"),
        "{}",
        tool.model_id()
    );
    if let Some(generic) = model() {
        assert!(
            generic.model_id().starts_with("all-MiniLM-L6-v2/"),
            "{}",
            generic.model_id()
        );
    }
    let tools = [
        "get_forecast: Get the weather forecast for a city",
        "create_issue: Open a new issue in a GitHub repository",
        "send_email: Send an email message to a recipient",
        "query_sql: Run a read-only SQL query against the database",
    ];
    let vectors = tool.embed(&tools).unwrap();
    for (task, want) in [
        ("will it rain in Berlin this weekend", 0),
        ("report a bug in our repo", 1),
        ("mail my manager that I will be late", 2),
        ("list last week's new customers from the database", 3),
    ] {
        let q = tool.embed_query(task).unwrap();
        let best = (0..tools.len())
            .max_by(|&a, &b| cosine(&q, &vectors[a]).total_cmp(&cosine(&q, &vectors[b])))
            .unwrap();
        assert_eq!(best, want, "{task:?} found {:?}", tools[best]);
    }
}
