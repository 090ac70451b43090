//! An on-disk cache of text vectors, so that a restart or a catalog change
//! only embeds the tools whose text is new.
//!
//! Layout: `<cache_dir>/<model>/<aa>/<key>.f32`, where `<model>` is the first
//! 16 hex digits of SHA-256 of the model id (a `model.txt` beside says which
//! model), `<key>` is SHA-256 of `model id NUL text` and `<aa>` its first two
//! digits. Each file holds one vector as little-endian `f32`s. Files are
//! written to a temporary name and renamed, so readers (other processes
//! included) never see half a vector. Nothing is ever evicted: the cache grows
//! with the number of distinct tool texts seen, about 1.5 KB each for
//! all-MiniLM-L6-v2, and may be deleted at any time.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use manifold_search::{EmbedError, Embedder};
use sha2::{Digest, Sha256};

/// Misses are embedded and written in slices of this many texts.
const WRITE_EVERY: usize = 256;
/// Vectors also kept in memory (about 1.5 KB each), so that re-indexing a
/// changed catalog reads no files; past this the memory is emptied.
const MEMORY_VECTORS: usize = 200_000;

/// Told how the texts missing from the cache are going, after each slice:
/// (embedded so far, to embed in this call). A first-time catalog embedding
/// takes minutes on a small machine, so the CLI draws a bar and the gateway
/// logs it.
pub type EmbedProgress = Arc<dyn Fn(usize, usize) + Send + Sync>;

/// Wraps an [`Embedder`] with the on-disk cache. Queries
/// ([`Embedder::embed_query`]) pass through uncached.
pub struct CachedEmbedder {
    inner: Arc<dyn Embedder>,
    dir: PathBuf,
    embedded: AtomicUsize,
    reused: AtomicUsize,
    memory: Mutex<HashMap<String, Arc<[f32]>>>,
    progress: Mutex<Option<EmbedProgress>>,
}

impl CachedEmbedder {
    /// Uses (and creates) `cache_dir/<model>/` for `inner`'s vectors.
    pub fn new(inner: Arc<dyn Embedder>, cache_dir: &Path) -> Result<Self, EmbedError> {
        let model = hex::encode(Sha256::digest(inner.model_id().as_bytes()));
        let dir = cache_dir.join(&model[..16]);
        std::fs::create_dir_all(&dir).map_err(|e| {
            EmbedError(format!(
                "cannot create the embedding cache {}: {e}",
                dir.display()
            ))
        })?;
        let label = dir.join("model.txt");
        if !label.exists() {
            // Only a label for people; failing to write it changes nothing.
            let _ = std::fs::write(&label, format!("{}\n", inner.model_id()));
        }
        Ok(Self {
            inner,
            dir,
            embedded: AtomicUsize::new(0),
            reused: AtomicUsize::new(0),
            memory: Mutex::new(HashMap::new()),
            progress: Mutex::new(None),
        })
    }

    /// Reports the progress of later embeddings to `report` (replacing any
    /// earlier observer; `None` stops reporting).
    pub fn on_progress(&self, report: Option<EmbedProgress>) {
        *self.progress.lock().expect("progress lock") = report;
    }

    /// Texts this instance sent to the model (cache misses, each distinct
    /// text once).
    pub fn embedded(&self) -> usize {
        self.embedded.load(Ordering::Relaxed)
    }

    /// Texts this instance answered from the cache.
    pub fn reused(&self) -> usize {
        self.reused.load(Ordering::Relaxed)
    }

    /// The embedder behind the cache.
    pub fn inner(&self) -> &Arc<dyn Embedder> {
        &self.inner
    }

    /// This model's folder in the cache.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn key(&self, text: &str) -> String {
        let mut hasher = Sha256::new();
        hasher.update(self.inner.model_id().as_bytes());
        hasher.update([0]);
        hasher.update(text.as_bytes());
        hex::encode(hasher.finalize())
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(&key[..2]).join(format!("{key}.f32"))
    }

    fn remember(&self, found: impl Iterator<Item = (String, Arc<[f32]>)>) {
        let mut memory = self.memory.lock().expect("embedding memory lock");
        for (key, v) in found {
            if memory.len() >= MEMORY_VECTORS {
                memory.clear();
            }
            memory.insert(key, v);
        }
    }
}

fn read_vector(path: &Path) -> Option<Vec<f32>> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.is_empty() || bytes.len() % 4 != 0 {
        return None;
    }
    Some(
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    )
}

fn write_vector(path: &Path, v: &[f32]) -> std::io::Result<()> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let parent = path.parent().expect("cache paths have a parent");
    std::fs::create_dir_all(parent)?;
    let tmp = parent.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("v"),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

impl Embedder for CachedEmbedder {
    fn model_id(&self) -> &str {
        self.inner.model_id()
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let keys: Vec<String> = texts.iter().map(|t| self.key(t)).collect();
        let mut out: Vec<Option<Vec<f32>>> = {
            let memory = self.memory.lock().expect("embedding memory lock");
            keys.iter()
                .map(|k| memory.get(k).map(|v| v.to_vec()))
                .collect()
        };
        let mut read = Vec::new();
        for (i, slot) in out.iter_mut().enumerate() {
            if slot.is_none()
                && let Some(v) = read_vector(&self.path(&keys[i]))
            {
                read.push((keys[i].clone(), Arc::from(v.as_slice())));
                *slot = Some(v);
            }
        }
        self.remember(read.into_iter());
        // Each distinct missing text is embedded once.
        let mut missing: HashMap<&str, Vec<usize>> = HashMap::new();
        let mut order = Vec::new();
        for (i, v) in out.iter().enumerate() {
            if v.is_none() {
                missing
                    .entry(texts[i])
                    .or_insert_with(|| {
                        order.push(texts[i]);
                        Vec::new()
                    })
                    .push(i);
            }
        }
        self.reused.fetch_add(
            texts.len() - missing.values().map(Vec::len).sum::<usize>(),
            Ordering::Relaxed,
        );
        // In slices, so that an interrupted first build keeps what it did.
        let mut warned = false;
        let progress = self.progress.lock().expect("progress lock").clone();
        let (total, mut done) = (order.len(), 0);
        if let Some(report) = progress.as_ref().filter(|_| total > 0) {
            report(0, total);
        }
        for slice in order.chunks(WRITE_EVERY) {
            let vectors = self.inner.embed(slice)?;
            if vectors.len() != slice.len() {
                return Err(EmbedError(format!(
                    "the embedder returned {} vectors for {} texts",
                    vectors.len(),
                    slice.len()
                )));
            }
            self.embedded.fetch_add(slice.len(), Ordering::Relaxed);
            done += slice.len();
            if let Some(report) = &progress {
                report(done, total);
            }
            for (text, v) in slice.iter().zip(vectors) {
                let slots = &missing[text];
                if let Err(e) = write_vector(&self.path(&keys[slots[0]]), &v)
                    && !warned
                {
                    warned = true;
                    tracing::warn!(dir = %self.dir.display(), "cannot write the embedding cache: {e}");
                }
                self.remember(std::iter::once((
                    keys[slots[0]].clone(),
                    Arc::from(v.as_slice()),
                )));
                for &i in slots {
                    out[i] = Some(v.clone());
                }
            }
        }
        Ok(out.into_iter().map(|v| v.expect("filled")).collect())
    }

    fn embed_query(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        self.inner.embed_query(text)
    }

    fn embed_queries(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.inner.embed_queries(texts)
    }
}
