//! Times one query's forward pass at several lengths through every kernel
//! this CPU has, side by side in one run, and prints how far each kernel's
//! vectors are from candle's (the committed reference vectors,
//! `tests/embed/reference_vectors.json`) and from the portable kernel's:
//! `cargo run --release -p manifold-embed --example forward [MODEL_DIR]`.
//! To profile one length: `FORWARD_WORDS=16 FORWARD_CALLS=1000`.

use std::time::Instant;

use manifold_embed::{Embedder, MiniLm, resolve_model_dir};
use serde_json::Value;

/// CPU time of the whole process (every thread), in ms: on a shared
/// machine it says what a call costs better than the wall clock does.
fn cpu_ms() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 / 1e6
}

/// Median wall and CPU time of `FORWARD_CALLS` calls (30 unless set; more
/// to profile one length), in ms.
fn p50(mut f: impl FnMut()) -> (f64, f64) {
    f();
    let calls = std::env::var("FORWARD_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30usize);
    let (mut wall, mut cpu): (Vec<f64>, Vec<f64>) = (0..calls.max(1))
        .map(|_| {
            let (t, c) = (Instant::now(), cpu_ms());
            f();
            (t.elapsed().as_secs_f64() * 1e3, cpu_ms() - c)
        })
        .unzip();
    wall.sort_by(f64::total_cmp);
    cpu.sort_by(f64::total_cmp);
    (wall[wall.len() / 2], cpu[cpu.len() / 2])
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let dir = match std::env::args().nth(1) {
        Some(d) => d.into(),
        None => resolve_model_dir(None, &[std::env::current_dir()?])?,
    };
    let reference: Value =
        serde_json::from_str(include_str!("../tests/embed/reference_vectors.json"))?;
    let texts: Vec<&str> = reference["texts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    // With MANIFOLD_EMBED_KERNEL set, time that kernel alone (the portable
    // one is 40× slower and drowns a profile).
    let kernels: Vec<&str> = match std::env::var("MANIFOLD_EMBED_KERNEL") {
        Ok(k) if !k.is_empty() => MiniLm::kernels().into_iter().filter(|m| *m == k).collect(),
        _ => MiniLm::kernels(),
    };
    let models: Vec<MiniLm> = kernels
        .iter()
        .map(|k| MiniLm::load_with_kernel(&dir, k))
        .collect::<Result<_, _>>()?;
    println!(
        "candle {} reference, kernels {kernels:?}",
        reference["candle"]
    );
    for model in &models {
        let ours = model.embed(&texts)?;
        let worst = ours
            .iter()
            .zip(reference["vectors"].as_array().unwrap())
            .map(|(a, b)| {
                let b: Vec<f32> = serde_json::from_value(b.clone()).unwrap();
                dot(a, &b)
            })
            .fold(1.0f32, f32::min);
        println!("{:>9}: lowest cosine to candle {worst:.6}", model.kernel());
    }

    let sentence =
        "please find the latest papers about tool retrieval on arxiv and summarise the trends";
    print!("words");
    for k in &kernels {
        print!("  {k:>9} wall/cpu ms");
    }
    println!("  (cosine to portable)");
    let portable = models
        .iter()
        .find(|m| m.kernel() == "portable")
        .unwrap_or(&models[0]);
    // FORWARD_WORDS=16 times that length alone.
    let lengths: Vec<usize> = match std::env::var("FORWARD_WORDS") {
        Ok(w) => w.split(',').filter_map(|n| n.trim().parse().ok()).collect(),
        Err(_) => vec![8, 16, 32, 64, 128],
    };
    for words in lengths {
        let text: String = sentence
            .split(' ')
            .cycle()
            .take(words)
            .collect::<Vec<_>>()
            .join(" ");
        let base = portable.embed(&[&text])?.remove(0);
        print!("{words:>5}");
        for model in &models {
            let v = model.embed(&[&text])?.remove(0);
            let (wall, cpu) = p50(|| drop(model.embed(&[&text]).unwrap()));
            print!("  {wall:>7.2} / {cpu:>7.2} ({:.5})", dot(&v, &base));
        }
        println!();
    }
    Ok(())
}
