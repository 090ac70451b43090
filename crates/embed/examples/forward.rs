//! Times one query's forward pass at several lengths, through the plain-Rust
//! encoder and through candle, and prints how far their vectors differ:
//! `cargo run --release -p manifold-embed --example forward [MODEL_DIR]`.
//! `MANIFOLD_EMBED_KERNEL=avx512` (or `amx`, `avx2`, `portable`) picks the
//! encoder's kernel.

use std::time::Instant;

use manifold_embed::{Embedder, MiniLm, resolve_model_dir};

#[path = "../tests/reference/mod.rs"]
mod reference;

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

/// Median wall and CPU time of 30 calls, in ms.
fn p50(mut f: impl FnMut()) -> (f64, f64) {
    f();
    let (mut wall, mut cpu): (Vec<f64>, Vec<f64>) = (0..30)
        .map(|_| {
            let (t, c) = (Instant::now(), cpu_ms());
            f();
            (t.elapsed().as_secs_f64() * 1e3, cpu_ms() - c)
        })
        .unzip();
    wall.sort_by(f64::total_cmp);
    cpu.sort_by(f64::total_cmp);
    (wall[15], cpu[15])
}

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let dir = match std::env::args().nth(1) {
        Some(d) => d.into(),
        None => resolve_model_dir(None, &[std::env::current_dir()?])?,
    };
    let model = MiniLm::load(&dir)?;
    let candle = reference::CandleMiniLm::load(&dir)?;
    let sentence =
        "please find the latest papers about tool retrieval on arxiv and summarise the trends";
    println!("kernel {} of {:?}", model.kernel(), MiniLm::kernels());
    println!("words  encoder wall/cpu ms  candle wall/cpu ms  cpu ratio  cosine");
    for words in [8, 16, 32, 64, 128] {
        let text: String = sentence
            .split(' ')
            .cycle()
            .take(words)
            .collect::<Vec<_>>()
            .join(" ");
        let fast = model.embed(&[&text])?.remove(0);
        let reference = candle.embed(&[&text])?.remove(0);
        let cosine: f32 = fast.iter().zip(&reference).map(|(a, b)| a * b).sum();
        let a = p50(|| drop(model.embed(&[&text]).unwrap()));
        let b = p50(|| drop(candle.embed(&[&text]).unwrap()));
        println!(
            "{words:>5}  {:>9.2} / {:>7.2}  {:>8.2} / {:>7.2}  {:>9.2}  {cosine:.6}",
            a.0,
            a.1,
            b.0,
            b.1,
            a.1 / b.1
        );
    }
    Ok(())
}
