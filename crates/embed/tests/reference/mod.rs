//! all-MiniLM-L6-v2 through candle's BERT, in padded batches with an
//! attention mask: the reference the plain-Rust encoder is checked against
//! (`tests/minilm.rs`) and timed against (`examples/forward.rs`).

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::Tokenizer;

pub struct CandleMiniLm {
    model: BertModel,
    tokenizer: Tokenizer,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

impl CandleMiniLm {
    pub fn load(dir: &Path) -> Result<Self, Error> {
        let config: Config = serde_json::from_slice(&std::fs::read(dir.join("config.json"))?)?;
        let tokenizer =
            manifold_embed::load_tokenizer(&std::fs::read(dir.join("tokenizer.json"))?)?;
        let weights = std::fs::read(dir.join("model.safetensors"))?;
        let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, &Device::Cpu)?;
        Ok(Self {
            model: BertModel::load(vb, &config)?,
            tokenizer,
        })
    }

    /// Unit vectors of `texts`, in one padded batch.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, Error> {
        let encodings = self.tokenizer.encode_batch(texts.to_vec(), true)?;
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
        let ids = Tensor::from_vec(ids, shape, &Device::Cpu)?;
        let mask = Tensor::from_vec(mask, shape, &Device::Cpu)?;
        let hidden = self.model.forward(&ids, &ids.zeros_like()?, Some(&mask))?;
        let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
        let mean = hidden
            .broadcast_mul(&mask)?
            .sum(1)?
            .broadcast_div(&mask.sum(1)?.clamp(1e-9, f64::MAX)?)?;
        let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f64::MAX)?;
        Ok(mean.broadcast_div(&norm)?.to_vec2::<f32>()?)
    }
}
