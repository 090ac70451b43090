//! all-MiniLM-L6-v2 through candle's BERT, in one padded batch with an
//! attention mask and mean pooling, written as JSON:
//! `{"candle": VERSION, "model_sha256": .., "texts": [..], "vectors": [[..]]}`.
//!
//! Usage: manifold-reference-vectors MODEL_DIR OUT.json
//! (`scripts/reference-vectors.sh` runs it with the test model.)

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{Tokenizer, TruncationParams};

type Error = Box<dyn std::error::Error + Send + Sync>;

const CANDLE_VERSION: &str = "0.11.1";

/// Short and long, ASCII and not, and one past the model's 256 tokens, so
/// that truncation is checked too.
fn texts() -> Vec<String> {
    vec![
        "hi".into(),
        "Get the current weather forecast for a city".into(),
        "github: create pull request: Create a new pull request in a GitHub repository".into(),
        "数据库 查询 SQL".into(),
        "search the web for recent papers and summarise them ".repeat(60),
        "A man is eating food.".into(),
        "A man is eating a piece of bread.".into(),
        "The stock market fell sharply today.".into(),
    ]
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, out] = args.as_slice() else {
        return Err("usage: manifold-reference-vectors MODEL_DIR OUT.json".into());
    };
    let dir = Path::new(dir);
    let config: Config = serde_json::from_slice(&std::fs::read(dir.join("config.json"))?)?;
    let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))?;
    // The shipped tokenizer pads every text to 128 tokens; pad to the batch's
    // longest instead, and let the attention mask hide the padding.
    tokenizer.with_padding(None);
    // The encoder's limit (manifold-embed's MAX_TOKENS).
    tokenizer.with_truncation(Some(TruncationParams {
        max_length: 256,
        ..TruncationParams::default()
    }))?;
    let weights = std::fs::read(dir.join("model.safetensors"))?;
    let model_sha256 = sha256_hex(&weights);
    let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, &Device::Cpu)?;
    let model = BertModel::load(vb, &config)?;

    let texts = texts();
    let encodings = tokenizer.encode_batch(texts.clone(), true)?;
    let len = encodings.iter().map(|e| e.get_ids().len()).max().unwrap_or(0);
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
    let hidden = model.forward(&ids, &ids.zeros_like()?, Some(&mask))?;
    let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
    let mean = hidden
        .broadcast_mul(&mask)?
        .sum(1)?
        .broadcast_div(&mask.sum(1)?.clamp(1e-9, f64::MAX)?)?;
    let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f64::MAX)?;
    let vectors = mean.broadcast_div(&norm)?.to_vec2::<f32>()?;

    let doc = serde_json::json!({
        "candle": CANDLE_VERSION,
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "model_sha256": model_sha256,
        "texts": texts,
        "vectors": vectors,
    });
    std::fs::write(out, serde_json::to_string(&doc)? + "\n")?;
    eprintln!("wrote {} vectors of {} to {out}", vectors.len(), vectors[0].len());
    Ok(())
}

fn sha256_hex(bytes: &[u8]) -> String {
    use std::process::{Command, Stdio};
    use std::io::Write;
    // sha256sum keeps this tool's dependencies to candle and the tokenizer.
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha256sum runs");
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or("").to_string()
}
