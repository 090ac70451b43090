//! The on-disk vector cache, with a counting stand-in model.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use manifold_embed::{CachedEmbedder, EmbedError, Embedder};
use manifold_search::{SearchIndex, Strategy, ToolDoc};

/// Counts the texts it embeds; the vector is the text's length and vowels.
#[derive(Default)]
struct Counting {
    texts: AtomicUsize,
    queries: AtomicUsize,
}

impl Embedder for Counting {
    fn model_id(&self) -> &str {
        "counting-v1"
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.texts.fetch_add(texts.len(), Ordering::Relaxed);
        Ok(texts.iter().map(|t| features(t)).collect())
    }

    fn embed_query(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        self.queries.fetch_add(1, Ordering::Relaxed);
        Ok(features(text))
    }
}

fn features(text: &str) -> Vec<f32> {
    let count = |set: &str| text.chars().filter(|c| set.contains(*c)).count() as f32;
    vec![text.len() as f32, count("aeiou"), count("xyz") + 1.0]
}

fn tool(name: &str, description: &str) -> ToolDoc {
    ToolDoc {
        id: format!("s__{name}"),
        server: "s".into(),
        name: name.into(),
        description: description.into(),
        ..ToolDoc::default()
    }
}

fn catalog(n: usize) -> Vec<ToolDoc> {
    (0..n)
        .map(|i| tool(&format!("tool_{i}"), &format!("does thing number {i}")))
        .collect()
}

#[test]
fn restarts_reuse_vectors_and_changes_reembed_only_changed_tools() {
    let dir = tempfile::tempdir().unwrap();
    let model = Arc::new(Counting::default());

    let first = Arc::new(CachedEmbedder::new(model.clone(), dir.path()).unwrap());
    let a = SearchIndex::build(catalog(300))
        .with_embeddings(first.clone())
        .unwrap();
    assert_eq!(first.embedded(), 300);
    assert_eq!(model.texts.load(Ordering::Relaxed), 300);

    // Same catalog, new embedder over the same directory (a restart).
    let second = Arc::new(CachedEmbedder::new(model.clone(), dir.path()).unwrap());
    let b = SearchIndex::build(catalog(300))
        .with_embeddings(second.clone())
        .unwrap();
    assert_eq!(second.embedded(), 0, "a restart embeds no tool again");
    assert_eq!(second.reused(), 300);
    assert_eq!(model.texts.load(Ordering::Relaxed), 300);
    let q = "does thing number 7";
    assert_eq!(
        a.query(Strategy::Embedding, q, 5, &|_| true).unwrap(),
        b.query(Strategy::Embedding, q, 5, &|_| true).unwrap()
    );

    // Catalog change: one description edited, one tool added, one removed.
    let mut changed = catalog(300);
    changed[10].description = "now does something else".into();
    changed.remove(20);
    changed.push(tool("brand_new", "a new tool"));
    let third = Arc::new(CachedEmbedder::new(model.clone(), dir.path()).unwrap());
    SearchIndex::build(changed)
        .with_embeddings(third.clone())
        .unwrap();
    assert_eq!(third.embedded(), 2);
    assert_eq!(third.reused(), 298);

    // Queries go to the model and are not cached.
    let before = model.queries.load(Ordering::Relaxed);
    b.query(Strategy::Hybrid, q, 5, &|_| true).unwrap();
    b.query(Strategy::Hybrid, q, 5, &|_| true).unwrap();
    assert_eq!(model.queries.load(Ordering::Relaxed), before + 2);
    assert_eq!(second.embedded(), 0);
}

#[test]
fn identical_texts_are_embedded_once_and_models_do_not_share_vectors() {
    let dir = tempfile::tempdir().unwrap();
    let model = Arc::new(Counting::default());
    let cached = CachedEmbedder::new(model.clone(), dir.path()).unwrap();
    let v = cached.embed(&["same", "same", "other"]).unwrap();
    assert_eq!(v[0], v[1]);
    assert_eq!(cached.embedded(), 2);

    /// Same vectors, another model id: its cache entries are its own.
    struct Renamed(Arc<Counting>);
    impl Embedder for Renamed {
        fn model_id(&self) -> &str {
            "counting-v2"
        }
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            self.0.embed(texts)
        }
    }
    let other = CachedEmbedder::new(Arc::new(Renamed(model)), dir.path()).unwrap();
    other.embed(&["same"]).unwrap();
    assert_eq!(other.embedded(), 1);
}

#[test]
fn a_damaged_entry_is_embedded_again() {
    let dir = tempfile::tempdir().unwrap();
    let model = Arc::new(Counting::default());
    let cached = CachedEmbedder::new(model.clone(), dir.path()).unwrap();
    let want = cached.embed(&["text"]).unwrap();
    for entry in walk(dir.path()) {
        if entry.extension().is_some_and(|e| e == "f32") {
            std::fs::write(&entry, [1u8, 2, 3]).unwrap();
        }
    }
    let again = CachedEmbedder::new(model, dir.path()).unwrap();
    assert_eq!(again.embed(&["text"]).unwrap(), want);
    assert_eq!(again.embedded(), 1);
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[test]
fn progress_is_reported_for_new_texts_only() {
    let dir = tempfile::tempdir().unwrap();
    let model = Arc::new(Counting::default());
    let cached = Arc::new(CachedEmbedder::new(model, dir.path()).unwrap());
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    cached.on_progress(Some(Arc::new(move |done: usize, total: usize| {
        sink.lock().unwrap().push((done, total))
    })));
    SearchIndex::build(catalog(600))
        .with_embeddings(cached.clone())
        .unwrap();
    let reports = seen.lock().unwrap().clone();
    assert_eq!(reports.first(), Some(&(0, 600)), "{reports:?}");
    assert_eq!(reports.last(), Some(&(600, 600)), "{reports:?}");
    assert!(reports.windows(2).all(|w| w[0].0 < w[1].0), "{reports:?}");
    // Everything cached: nothing to report.
    seen.lock().unwrap().clear();
    SearchIndex::build(catalog(600))
        .with_embeddings(cached.clone())
        .unwrap();
    assert!(seen.lock().unwrap().is_empty());
}
