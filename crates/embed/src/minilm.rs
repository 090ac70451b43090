//! A MiniLM-L6 sentence encoder (the shipped tool model or the generic
//! all-MiniLM-L6-v2) on CPU: WordPiece tokens, a 6-layer BERT (`encoder.rs`),
//! mean pooling over the tokens, then L2 normalisation, as
//! sentence-transformers does.

use std::path::{Path, PathBuf};

use manifold_search::{EmbedError, Embedder};
use rayon::prelude::*;
use sha2::{Digest, Sha256};
use tokenizers::{Tokenizer, TruncationParams};

use crate::encoder::{BertShape, Encoder, Kernel};
use crate::{GENERIC_MODEL, PACKAGE_MODEL_DIR};

/// Longest input in tokens, as sentence-transformers sets for this model
/// (`sentence_bert_config.json`); longer texts are cut.
const MAX_TOKENS: usize = 256;

/// Rows (tokens) in one batch of the encoder: enough to share the weights'
/// trip through the core among many texts, few enough that the activations
/// stay in the core's cache.
const MAX_BATCH_ROWS: usize = 256;

/// A sentence-embedding model in the layout of sentence-transformers'
/// all-MiniLM-L6-v2: `config.json`, `tokenizer.json` and `model.safetensors`
/// in one directory.
pub struct MiniLm {
    encoder: Encoder,
    tokenizer: Tokenizer,
    model_id: String,
}

/// The size and 256 evenly spaced 4 KiB samples of a weights file.
fn weights_fingerprint(weights: &[u8]) -> [u8; 32] {
    const SAMPLES: usize = 256;
    const BLOCK: usize = 4096;
    let mut hasher = Sha256::new();
    hasher.update((weights.len() as u64).to_le_bytes());
    let stride = (weights.len() / SAMPLES).max(1);
    for start in (0..weights.len()).step_by(stride).take(SAMPLES) {
        hasher.update(&weights[start..(start + BLOCK).min(weights.len())]);
    }
    hasher.finalize().into()
}

impl MiniLm {
    /// Loads the model from `dir`, with the fastest matmul kernel this CPU
    /// has (or the one `MANIFOLD_EMBED_KERNEL` names). Reads local files only.
    pub fn load(dir: &Path) -> Result<Self, EmbedError> {
        Self::load_with(dir, Kernel::detect())
    }

    /// Loads the model with the kernel named `kernel` (one of
    /// [`kernels`](MiniLm::kernels)), to compare kernels.
    pub fn load_with_kernel(dir: &Path, kernel: &str) -> Result<Self, EmbedError> {
        let found = Kernel::available().into_iter().find(|k| k.name() == kernel);
        let kernel = found.ok_or_else(|| {
            EmbedError(format!(
                "this CPU has no {kernel:?} kernel; it has {:?}",
                Self::kernels()
            ))
        })?;
        Self::load_with(dir, kernel)
    }

    /// The matmul kernels this CPU can run, best first.
    pub fn kernels() -> Vec<&'static str> {
        Kernel::available().into_iter().map(Kernel::name).collect()
    }

    /// The kernel this model runs on.
    pub fn kernel(&self) -> &'static str {
        self.encoder.kernel().name()
    }

    fn load_with(dir: &Path, kernel: Kernel) -> Result<Self, EmbedError> {
        let read = |name: &str| -> Result<(PathBuf, Vec<u8>), EmbedError> {
            let path = dir.join(name);
            let bytes = std::fs::read(&path)
                .map_err(|e| EmbedError(format!("cannot read {}: {e}", path.display())))?;
            Ok((path, bytes))
        };
        let (config_path, config_bytes) = read("config.json")?;
        let shape: BertShape = serde_json::from_slice(&config_bytes)
            .map_err(|e| EmbedError(format!("{}: {e}", config_path.display())))?;
        let (tokenizer_path, tokenizer_bytes) = read("tokenizer.json")?;
        let tokenizer = load_tokenizer(&tokenizer_bytes)
            .map_err(|e| EmbedError(format!("{}: {e}", tokenizer_path.display())))?;
        let (_, weights) = read("model.safetensors")?;
        // The id changes with the files that decide the vectors: config,
        // tokenizer, and the weights. A fine-tune has the same size as its
        // base, so the weights are fingerprinted by evenly spaced samples
        // (a fine-tune changes nearly every value; hashing all 90 MB at
        // every start would cost more than it protects against).
        let mut hasher = Sha256::new();
        hasher.update(&config_bytes);
        hasher.update(&tokenizer_bytes);
        hasher.update(weights_fingerprint(&weights));
        // The kernel too: bfloat16 (AMX) and f16 weights give vectors that
        // differ in the fifth decimal, and a tool's cached vector should come
        // from the same arithmetic as the queries it is compared with.
        let encoder = Encoder::load(&shape, &weights, kernel)?;
        let numerics = encoder.kernel().numerics();
        hasher.update(format!("mean-pool/l2/max{MAX_TOKENS}/{numerics}"));
        // The name says which model, the hash which weights and arithmetic.
        let name = if dir.ends_with(PACKAGE_MODEL_DIR) {
            GENERIC_MODEL
        } else {
            dir.file_name()
                .and_then(|n| n.to_str())
                .unwrap_or(GENERIC_MODEL)
        };
        let model_id = format!("{name}/{}", &hex::encode(hasher.finalize())[..16]);
        Ok(Self {
            encoder,
            tokenizer,
            model_id,
        })
    }

    fn tokens(&self, text: &str) -> Result<Vec<u32>, EmbedError> {
        let encoding = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| EmbedError(format!("tokenizer: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }
}

/// The model's WordPiece tokenizer, set up as sentence-transformers uses it.
/// The shipped `tokenizer.json` pads every input to 128 tokens and cuts at
/// 128; one text at a time needs no padding, and the cut is the model's 256.
pub fn load_tokenizer(bytes: &[u8]) -> Result<Tokenizer, String> {
    let mut tokenizer = Tokenizer::from_bytes(bytes).map_err(|e| e.to_string())?;
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(Some(TruncationParams {
            max_length: MAX_TOKENS,
            ..TruncationParams::default()
        }))
        .map_err(|e| e.to_string())?;
    Ok(tokenizer)
}

impl Embedder for MiniLm {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        // On one of rayon's threads: a query's fifty-odd fork-joins (one per
        // matmul and per glue step) then start and end inside the pool,
        // instead of each crossing into it and waking this thread back up.
        rayon::scope(|_| self.embed_in_pool(texts))
    }

    fn embed_queries(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed(texts)
    }
}

impl MiniLm {
    fn embed_in_pool(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let tokens: Vec<Vec<u32>> = texts
            .par_iter()
            .map(|text| self.tokens(text))
            .collect::<Result<_, _>>()?;
        // One text: each matmul spreads over the threads. Many: batches of
        // texts do, one batch per thread (and more when they are many), so
        // each thread streams the weights once per batch.
        if let [ids] = tokens.as_slice() {
            return self.encoder.encode(&[ids], true);
        }
        let rows: usize = tokens.iter().map(|t| self.encoder.rows(t)).sum();
        let per_batch = rows
            .div_ceil(rayon::current_num_threads())
            .clamp(1, MAX_BATCH_ROWS);
        let mut batches: Vec<Vec<&[u32]>> = vec![Vec::new()];
        let mut filled = 0;
        for ids in &tokens {
            let r = self.encoder.rows(ids);
            if filled > 0 && filled + r > per_batch {
                batches.push(Vec::new());
                filled = 0;
            }
            batches.last_mut().expect("one batch").push(ids);
            filled += r;
        }
        let vectors: Vec<Vec<Vec<f32>>> = batches
            .par_iter()
            .map(|batch| self.encoder.encode(batch, false))
            .collect::<Result<_, _>>()?;
        Ok(vectors.into_iter().flatten().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::weights_fingerprint;

    #[test]
    fn a_fine_tune_of_the_same_size_gets_another_id() {
        let base: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut tuned = base.clone();
        // A fine-tune nudges (nearly) every weight.
        for (i, b) in tuned.iter_mut().enumerate() {
            if i % 7 == 0 {
                *b = b.wrapping_add(1);
            }
        }
        assert_eq!(
            weights_fingerprint(&base),
            weights_fingerprint(&base.clone())
        );
        assert_ne!(weights_fingerprint(&base), weights_fingerprint(&tuned));
        assert_ne!(
            weights_fingerprint(&base),
            weights_fingerprint(&base[..base.len() - 1])
        );
        assert_eq!(weights_fingerprint(&[]), weights_fingerprint(&[]));
    }
}
