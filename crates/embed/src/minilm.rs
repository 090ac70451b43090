//! all-MiniLM-L6-v2 on CPU with candle: WordPiece tokens, a 6-layer BERT,
//! mean pooling over the real tokens, then L2 normalisation, as
//! sentence-transformers does.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use manifold_search::{EmbedError, Embedder};
use sha2::{Digest, Sha256};
use tokenizers::{Tokenizer, TruncationParams};

/// Longest input in tokens, as sentence-transformers sets for this model
/// (`sentence_bert_config.json`); longer texts are cut.
const MAX_TOKENS: usize = 256;
/// Texts per forward pass when embedding many. Texts are sorted by length
/// first, so a batch pads little.
const BATCH: usize = 32;

/// A sentence-embedding model in the layout of sentence-transformers'
/// all-MiniLM-L6-v2: `config.json`, `tokenizer.json` and `model.safetensors`
/// in one directory.
pub struct MiniLm {
    model: BertModel,
    tokenizer: Tokenizer,
    device: Device,
    model_id: String,
}

fn err(context: &str) -> impl FnOnce(candle_core::Error) -> EmbedError + '_ {
    move |e| EmbedError(format!("{context}: {e}"))
}

impl MiniLm {
    /// Loads the model from `dir`. Reads local files only.
    pub fn load(dir: &Path) -> Result<Self, EmbedError> {
        let read = |name: &str| -> Result<(PathBuf, Vec<u8>), EmbedError> {
            let path = dir.join(name);
            let bytes = std::fs::read(&path)
                .map_err(|e| EmbedError(format!("cannot read {}: {e}", path.display())))?;
            Ok((path, bytes))
        };
        let (config_path, config_bytes) = read("config.json")?;
        let config: Config = serde_json::from_slice(&config_bytes)
            .map_err(|e| EmbedError(format!("{}: {e}", config_path.display())))?;
        let (tokenizer_path, tokenizer_bytes) = read("tokenizer.json")?;
        let mut tokenizer = Tokenizer::from_bytes(&tokenizer_bytes)
            .map_err(|e| EmbedError(format!("{}: {e}", tokenizer_path.display())))?;
        // The shipped tokenizer pads every input to 128 tokens and cuts at
        // 128. Padding is done here per batch, with an attention mask, and
        // the cut is the model's own 256.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MAX_TOKENS,
                ..TruncationParams::default()
            }))
            .map_err(|e| EmbedError(format!("{}: {e}", tokenizer_path.display())))?;

        let weights_path = dir.join("model.safetensors");
        let weights = std::fs::read(&weights_path)
            .map_err(|e| EmbedError(format!("cannot read {}: {e}", weights_path.display())))?;
        let device = Device::Cpu;
        // The id changes with the files that decide the vectors: config,
        // tokenizer, and the weights (by size; hashing 90 MB at every start
        // would cost more than it protects against).
        let mut hasher = Sha256::new();
        hasher.update(&config_bytes);
        hasher.update(&tokenizer_bytes);
        hasher.update((weights.len() as u64).to_le_bytes());
        hasher.update(format!("mean-pool/l2/max{MAX_TOKENS}"));
        let model_id = format!("all-MiniLM-L6-v2/{}", &hex::encode(hasher.finalize())[..16]);
        let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, &device)
            .map_err(err("cannot load model.safetensors"))?;
        let model = BertModel::load(vb, &config).map_err(err("cannot build the BERT model"))?;
        Ok(Self {
            model,
            tokenizer,
            device,
            model_id,
        })
    }

    /// One forward pass over texts of similar length.
    fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| EmbedError(format!("tokenizer: {e}")))?;
        let len = encodings
            .iter()
            .map(|e| e.get_ids().len())
            .max()
            .unwrap_or(0);
        let mut ids = vec![0u32; texts.len() * len];
        let mut mask = vec![0u32; texts.len() * len];
        for (row, e) in encodings.iter().enumerate() {
            let n = e.get_ids().len();
            ids[row * len..row * len + n].copy_from_slice(e.get_ids());
            mask[row * len..row * len + n].copy_from_slice(e.get_attention_mask());
        }
        let shape = (texts.len(), len);
        let run = || -> candle_core::Result<Vec<Vec<f32>>> {
            let ids = Tensor::from_vec(ids, shape, &self.device)?;
            let mask = Tensor::from_vec(mask, shape, &self.device)?;
            let types = ids.zeros_like()?;
            let hidden = self.model.forward(&ids, &types, Some(&mask))?;
            // Mean over the real tokens only: padding must not pull vectors
            // together.
            let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
            let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
            let counts = mask.sum(1)?.clamp(1e-9, f64::MAX)?;
            let mean = summed.broadcast_div(&counts)?;
            let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f64::MAX)?;
            mean.broadcast_div(&norm)?.to_vec2::<f32>()
        };
        run().map_err(err("forward pass"))
    }
}

impl Embedder for MiniLm {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        // Sort by length so that each batch pads to a similar length, then
        // put the vectors back in the caller's order.
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| texts[i].len());
        let mut out = vec![Vec::new(); texts.len()];
        for chunk in order.chunks(BATCH) {
            let batch: Vec<&str> = chunk.iter().map(|&i| texts[i]).collect();
            for (&i, v) in chunk.iter().zip(self.embed_batch(&batch)?) {
                out[i] = v;
            }
        }
        Ok(out)
    }
}
