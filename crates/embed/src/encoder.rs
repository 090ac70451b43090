//! A BERT encoder's forward pass over one text, in plain Rust.
//!
//! Why not candle: a query is one short text (about 25 tokens). At that size
//! candle's matmul spends most of its time repacking each weight matrix on
//! every call, and a query took 22 ms on 2 cores. Here each weight matrix is
//! packed once, at load, into column panels that a register-blocked kernel
//! streams through, and one text needs no padding and no attention mask.
//! Candle stays as the reference in the tests (`tests/minilm.rs`).

use rayon::prelude::*;
use safetensors::{Dtype, SafeTensors};

use manifold_search::EmbedError;

/// The shape of a BERT encoder, from its `config.json`.
#[derive(Debug, Clone, serde::Deserialize)]
pub(crate) struct BertShape {
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    pub num_hidden_layers: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_act")]
    pub hidden_act: String,
}

fn default_eps() -> f64 {
    1e-12
}

fn default_act() -> String {
    "gelu".into()
}

pub(crate) struct Encoder {
    word: Vec<f32>,
    position: Vec<f32>,
    token_type: Vec<f32>,
    embed_norm: Norm,
    layers: Vec<Layer>,
    hidden: usize,
    heads: usize,
    max_positions: usize,
    kernel: Kernel,
}

struct Layer {
    qkv: Linear,
    attn_out: Linear,
    attn_norm: Norm,
    up: Linear,
    down: Linear,
    out_norm: Norm,
}

struct Norm {
    weight: Vec<f32>,
    bias: Vec<f32>,
    eps: f32,
}

/// `y = x·Wᵀ + b` with W packed as `[n / NR][k][NR]` (zero columns pad the
/// last panel), so the kernel reads it front to back. AMX's panels are
/// `[n / 16][k / 2][16][2]`: the two weights of a pair of k sit side by
/// side, as a bfloat16 tile row holds them.
struct Linear {
    /// IEEE half-precision bits (bfloat16 bits for the bf16 kernel): a
    /// query's cost is the weights streaming through the core, and half the
    /// bytes made the forward pass about twice as fast. BERT's weights are
    /// far inside f16's range; the vectors agree with full precision to a
    /// cosine above 0.9999.
    panels: Vec<u16>,
    bias: Vec<f32>,
    k: usize,
    n: usize,
}

/// The matmul kernel for this CPU, chosen once at load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Kernel {
    /// Intel AMX: 16×16 tiles of f32 accumulated from bfloat16 tiles by the
    /// core's matrix unit, about 60× the multiply-adds per cycle of AVX-512
    /// on this kind of machine.
    #[cfg(target_arch = "x86_64")]
    Amx,
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Portable,
}

impl Kernel {
    /// Every kernel this CPU can run, best first.
    pub(crate) fn available() -> Vec<Kernel> {
        let mut kernels = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if amx::available() {
                kernels.push(Kernel::Amx);
            }
            if std::is_x86_feature_detected!("avx512f") {
                kernels.push(Kernel::Avx512);
            }
            if std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
            {
                kernels.push(Kernel::Avx2);
            }
        }
        kernels.push(Kernel::Portable);
        kernels
    }

    /// The best kernel, or the one [`KERNEL_ENV`] names if this CPU has it.
    pub(crate) fn detect() -> Self {
        let available = Self::available();
        let chosen = std::env::var(KERNEL_ENV).ok();
        available
            .iter()
            .copied()
            .find(|k| chosen.as_deref() == Some(k.name()))
            .unwrap_or(available[0])
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Amx => "amx",
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => "avx512",
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => "avx2",
            Kernel::Portable => "portable",
        }
    }

    /// This kernel, or AVX-512 when AMX cannot tile these matrices (each
    /// tile step takes 32 values of k).
    fn fit(self, ks: &[usize]) -> Self {
        #[cfg(target_arch = "x86_64")]
        if self == Kernel::Amx && ks.iter().any(|k| !k.is_multiple_of(amx::K_STEP)) {
            return Kernel::Avx512;
        }
        let _ = ks;
        self
    }

    /// Columns of one panel.
    fn columns(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 | Kernel::Amx => 16,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => 16,
            Kernel::Portable => 8,
        }
    }

    /// Rows of one register block for a matrix of `m` rows. AVX-512 holds
    /// up to 28 rows of one 16-wide column in its 32 registers, so a query's
    /// weights stream through the core once instead of once per 8 rows (the
    /// kernel was bound by that stream).
    fn rows(self, m: usize) -> usize {
        match self {
            // AMX blocks rows in tiles of 16.
            #[cfg(target_arch = "x86_64")]
            Kernel::Amx => 16,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => {
                let per_block = m.div_ceil(m.div_ceil(28));
                AVX512_ROWS
                    .into_iter()
                    .find(|&r| r >= per_block)
                    .unwrap_or(28)
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => AVX2_ROWS,
            Kernel::Portable => 4,
        }
    }

    /// Whether weights are bfloat16 pairs and activations bfloat16 rows.
    fn pairs(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if self == Kernel::Amx {
            return true;
        }
        false
    }

    /// The arithmetic this kernel's vectors come from: vectors of different
    /// arithmetic differ in the fifth decimal.
    pub(crate) fn numerics(self) -> &'static str {
        if self.pairs() { "bf16" } else { "f16-weights" }
    }

    /// Runs the glue `f` compiled for this kernel's instruction set.
    #[inline(always)]
    fn run<R>(self, f: impl FnOnce() -> R) -> R {
        match self {
            // SAFETY: `detect` chose these only when the CPU has the features.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 | Kernel::Amx => unsafe { run_avx512(f) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { run_avx2(f) },
            Kernel::Portable => f(),
        }
    }

    /// One column panel for every row block of `x` (packed by [`pack_rows`]),
    /// whose first `m` rows are real.
    fn panel(self, mr: usize, x: &Packed, w: &[u16], out: &mut [f32], k: usize, m: usize) {
        let x = match x {
            Packed::F32(x) => x,
            Packed::Bf16Rows(x) => {
                // SAFETY: only `Amx` packs bfloat16 rows, and `detect` chose
                // it only when the CPU has AMX and Linux granted its state.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    amx::panel(x, w, out, k)
                };
                return;
            }
        };
        match self {
            // SAFETY: `detect` chose these only when the CPU has the features.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 | Kernel::Amx => unsafe {
                match mr {
                    4 => panel_avx512::<4>(x, w, out, k),
                    8 => panel_avx512::<8>(x, w, out, k),
                    12 => panel_avx512::<12>(x, w, out, k),
                    16 => panel_avx512::<16>(x, w, out, k),
                    20 => panel_avx512::<20>(x, w, out, k),
                    24 => panel_avx512::<24>(x, w, out, k),
                    _ => panel_avx512::<28>(x, w, out, k),
                }
            },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { panel_avx2(x, w, out, k, m) },
            Kernel::Portable => panel_portable(x, w, out, k),
        }
    }
}

/// Names one kernel (`amx`, `avx512`, `avx2`, `portable`) to use instead of
/// the best this CPU has, to compare them.
pub(crate) const KERNEL_ENV: &str = "MANIFOLD_EMBED_KERNEL";

#[cfg(target_arch = "x86_64")]
const AVX512_ROWS: [usize; 7] = [4, 8, 12, 16, 20, 24, 28];

/// AVX-512: MR rows × 16 columns, MR accumulators held in zmm registers;
/// each step loads 16 weights once and broadcasts MR activations.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn panel_avx512<const MR: usize>(x: &[f32], w: &[u16], out: &mut [f32], k: usize) {
    use std::arch::x86_64::*;
    assert!(w.len() >= k * 16);
    for (xb, ob) in x.chunks_exact(MR * k).zip(out.chunks_exact_mut(MR * 16)) {
        let mut acc = [_mm512_setzero_ps(); MR];
        for kk in 0..k {
            // SAFETY: kk < k, so the 16 weights at kk * 16 are inside `w`
            // (asserted above).
            let wv = _mm512_cvtph_ps(unsafe {
                _mm256_loadu_si256(w.as_ptr().add(kk * 16) as *const __m256i)
            });
            let xs = &xb[kk * MR..][..MR];
            for i in 0..MR {
                acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(xs[i]), wv, acc[i]);
            }
        }
        for (o, a) in ob.chunks_exact_mut(16).zip(acc) {
            // SAFETY: each chunk holds exactly 16 floats.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), a) };
        }
    }
}

/// Intel AMX through inline assembly (its intrinsics are not stable Rust).
///
/// Tiles are per thread: every call configures them, and releases them when
/// done so that a context switch does not carry 8 KB of tile state.
#[cfg(target_arch = "x86_64")]
mod amx {
    use std::arch::asm;

    /// One instruction on accumulator tile `tmm(2 + r)`, between `$before`
    /// and `$after`: tile registers are named in the instruction text, so
    /// each needs its own `asm!`.
    macro_rules! on_acc {
        ($r:expr, $before:literal, $after:literal $(, $name:ident = $val:expr)*) => {
            match $r {
                0 => asm!(concat!($before, "tmm2", $after) $(, $name = in(reg) $val)*, options(nostack)),
                1 => asm!(concat!($before, "tmm3", $after) $(, $name = in(reg) $val)*, options(nostack)),
                2 => asm!(concat!($before, "tmm4", $after) $(, $name = in(reg) $val)*, options(nostack)),
                3 => asm!(concat!($before, "tmm5", $after) $(, $name = in(reg) $val)*, options(nostack)),
                4 => asm!(concat!($before, "tmm6", $after) $(, $name = in(reg) $val)*, options(nostack)),
                5 => asm!(concat!($before, "tmm7", $after) $(, $name = in(reg) $val)*, options(nostack)),
                _ => unreachable!("six accumulator tiles"),
            }
        };
    }

    /// Values of k per tile step: a bfloat16 tile row is 64 bytes.
    pub(super) const K_STEP: usize = 32;
    /// Accumulator tiles, tmm2 to tmm7; tmm0 holds activations, tmm1 weights.
    const ACC: usize = 6;

    /// Whether the CPU has AMX with bfloat16 and Linux lets this process
    /// use its tile state (it must be asked for once per process).
    pub(super) fn available() -> bool {
        let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
        let (bf16, tile) = (leaf7.edx & (1 << 22) != 0, leaf7.edx & (1 << 24) != 0);
        if !(bf16 && tile && std::is_x86_feature_detected!("avx512f")) {
            return false;
        }
        request_tile_state()
    }

    #[cfg(target_os = "linux")]
    fn request_tile_state() -> bool {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a plain system call with integer arguments.
        unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            ) == 0
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn request_tile_state() -> bool {
        false
    }

    #[repr(C, align(64))]
    struct TileConfig([u8; 64]);

    /// Palette 1, every tile 16 rows of 64 bytes.
    fn config() -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1;
        for t in 0..8 {
            c[16 + 2 * t] = 64;
            c[48 + t] = 16;
        }
        TileConfig(c)
    }

    /// One 16-column panel of `x·Wᵀ`: `a` is `[rows][k]` bfloat16, `w` the
    /// panel `[k / 2][16][2]` bfloat16, `out` `[rows][16]` f32.
    ///
    /// # Safety
    /// The CPU has AMX-BF16 and [`available`] returned true.
    pub(super) unsafe fn panel(a: &[u16], w: &[u16], out: &mut [f32], k: usize) {
        let rows = out.len() / 16;
        assert!(k.is_multiple_of(K_STEP) && rows.is_multiple_of(16));
        assert!(a.len() >= rows * k && w.len() >= k * 16);
        let cfg = config();
        // SAFETY (every block below): each tile load reads 16 rows of 64
        // bytes inside `a` or `w` and each store writes 16 rows of 64 bytes
        // inside `out`, by the asserts above; tiles were configured first.
        unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack)) };
        let (a_stride, row_stride) = (k * 2, 64usize);
        for group in (0..rows / 16).step_by(ACC) {
            let blocks = (rows / 16 - group).min(ACC);
            for r in 0..blocks {
                unsafe { on_acc!(r, "tilezero ", "") };
            }
            for c in 0..k / K_STEP {
                let b = unsafe { w.as_ptr().add(c * K_STEP * 16) };
                unsafe {
                    asm!("tileloadd tmm1, [{b} + {s}*1]", b = in(reg) b, s = in(reg) row_stride, options(nostack))
                };
                for r in 0..blocks {
                    let ap = unsafe { a.as_ptr().add((group + r) * 16 * k + c * K_STEP) };
                    unsafe {
                        asm!("tileloadd tmm0, [{a} + {s}*1]", a = in(reg) ap, s = in(reg) a_stride, options(nostack))
                    };
                    unsafe { on_acc!(r, "tdpbf16ps ", ", tmm0, tmm1") };
                }
            }
            for r in 0..blocks {
                let op = unsafe { out.as_mut_ptr().add((group + r) * 16 * 16) };
                unsafe { on_acc!(r, "tilestored [{p} + {s}*1], ", "", p = op, s = row_stride) };
            }
        }
        unsafe { asm!("tilerelease", options(nostack)) };
    }
}

/// AVX2 + FMA: 6 rows × 16 columns, 12 accumulators held in ymm registers.
/// The last block computes only the rows of `m` it holds: a query's rows
/// are seldom a multiple of 6, and padding cost up to a sixth of its work.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn panel_avx2(x: &[f32], w: &[u16], out: &mut [f32], k: usize, m: usize) {
    const MR: usize = AVX2_ROWS;
    assert!(w.len() >= k * 16);
    for (b, (xb, ob)) in x
        .chunks_exact(MR * k)
        .zip(out.chunks_exact_mut(MR * 16))
        .enumerate()
    {
        match m - b * MR {
            1 => block_avx2::<1>(xb, w, ob, k),
            2 => block_avx2::<2>(xb, w, ob, k),
            3 => block_avx2::<3>(xb, w, ob, k),
            4 => block_avx2::<4>(xb, w, ob, k),
            5 => block_avx2::<5>(xb, w, ob, k),
            _ => block_avx2::<MR>(xb, w, ob, k),
        }
    }
}

/// Rows of one AVX2 block (packed `AVX2_ROWS` apart).
#[cfg(target_arch = "x86_64")]
const AVX2_ROWS: usize = 6;

/// The first `T` rows of one AVX2 block.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn block_avx2<const T: usize>(xb: &[f32], w: &[u16], ob: &mut [f32], k: usize) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 2]; T];
    for kk in 0..k {
        // SAFETY: kk < k, so the 16 weights at kk * 16 are inside `w`
        // (the caller asserted it).
        let (w0, w1) = unsafe {
            let p = w.as_ptr().add(kk * 16) as *const __m128i;
            (_mm_loadu_si128(p), _mm_loadu_si128(p.add(1)))
        };
        let (w0, w1) = (_mm256_cvtph_ps(w0), _mm256_cvtph_ps(w1));
        let xs = &xb[kk * AVX2_ROWS..][..T];
        for i in 0..T {
            let xv = _mm256_set1_ps(xs[i]);
            acc[i][0] = _mm256_fmadd_ps(xv, w0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(xv, w1, acc[i][1]);
        }
    }
    for (o, a) in ob.chunks_exact_mut(8).zip(acc.into_iter().flatten()) {
        // SAFETY: each chunk holds exactly 8 floats.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), a) };
    }
}

/// Any CPU: the same blocking in plain Rust.
fn panel_portable(x: &[f32], w: &[u16], out: &mut [f32], k: usize) {
    const MR: usize = 4;
    const NR: usize = 8;
    for (xb, ob) in x.chunks_exact(MR * k).zip(out.chunks_exact_mut(MR * NR)) {
        let mut acc = [[0f32; NR]; MR];
        for (xs, ws) in xb.chunks_exact(MR).zip(w.chunks_exact(NR)) {
            for (a, &xv) in acc.iter_mut().zip(xs) {
                for (a, &wv) in a.iter_mut().zip(ws) {
                    *a += xv * half::f16::from_bits(wv).to_f32();
                }
            }
        }
        for (o, a) in ob.chunks_exact_mut(NR).zip(&acc) {
            o.copy_from_slice(a);
        }
    }
}

impl Encoder {
    pub(crate) fn load(
        shape: &BertShape,
        weights: &[u8],
        kernel: Kernel,
    ) -> Result<Self, EmbedError> {
        if shape.hidden_act != "gelu" {
            return Err(EmbedError(format!(
                "hidden_act {:?} is not supported (only gelu)",
                shape.hidden_act
            )));
        }
        if shape.num_attention_heads == 0
            || !shape.hidden_size.is_multiple_of(shape.num_attention_heads)
        {
            return Err(EmbedError(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                shape.hidden_size, shape.num_attention_heads
            )));
        }
        let st = SafeTensors::deserialize(weights)
            .map_err(|e| EmbedError(format!("model.safetensors: {e}")))?;
        let h = shape.hidden_size;
        let inter = shape.intermediate_size;
        let kernel = kernel.fit(&[h, inter]);
        let tensor = |name: &str, dims: &[usize]| read_f32(&st, name, dims);
        let eps = shape.layer_norm_eps as f32;
        let norm = |prefix: &str| -> Result<Norm, EmbedError> {
            Ok(Norm {
                weight: tensor(&format!("{prefix}.LayerNorm.weight"), &[h])?,
                bias: tensor(&format!("{prefix}.LayerNorm.bias"), &[h])?,
                eps,
            })
        };
        let linear = |names: &[String], k: usize, n_each: usize| -> Result<Linear, EmbedError> {
            let mut w = Vec::with_capacity(names.len() * n_each * k);
            let mut b = Vec::with_capacity(names.len() * n_each);
            for name in names {
                w.extend(tensor(&format!("{name}.weight"), &[n_each, k])?);
                b.extend(tensor(&format!("{name}.bias"), &[n_each])?);
            }
            Ok(Linear::pack(&w, b, k, kernel))
        };
        let mut layers = Vec::with_capacity(shape.num_hidden_layers);
        for i in 0..shape.num_hidden_layers {
            let p = format!("encoder.layer.{i}");
            let qkv = ["query", "key", "value"].map(|n| format!("{p}.attention.self.{n}"));
            layers.push(Layer {
                qkv: linear(&qkv, h, h)?,
                attn_out: linear(&[format!("{p}.attention.output.dense")], h, h)?,
                attn_norm: norm(&format!("{p}.attention.output"))?,
                up: linear(&[format!("{p}.intermediate.dense")], h, inter)?,
                down: linear(&[format!("{p}.output.dense")], inter, h)?,
                out_norm: norm(&format!("{p}.output"))?,
            });
        }
        let word = &st
            .tensor("embeddings.word_embeddings.weight")
            .map_err(|e| EmbedError(format!("embeddings.word_embeddings.weight: {e}")))?;
        let vocab = word.shape().first().copied().unwrap_or(0);
        Ok(Self {
            word: tensor("embeddings.word_embeddings.weight", &[vocab, h])?,
            position: tensor(
                "embeddings.position_embeddings.weight",
                &[shape.max_position_embeddings, h],
            )?,
            // Every token is of type 0.
            token_type: tensor("embeddings.token_type_embeddings.weight", &[0, h])?[..h].to_vec(),
            embed_norm: norm("embeddings")?,
            layers,
            hidden: h,
            heads: shape.num_attention_heads,
            max_positions: shape.max_position_embeddings,
            kernel,
        })
    }

    /// The kernel in use.
    pub(crate) fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// The mean-pooled, L2-normalised vectors of tokenised texts, run as
    /// one batch: every matmul takes all the texts' rows at once, so the
    /// weights stream through the core once per batch, not once per text.
    /// `parallel` spreads each matmul over rayon's threads: right for one
    /// batch, wrong when batches are already spread over the threads.
    pub(crate) fn encode(
        &self,
        texts: &[&[u32]],
        parallel: bool,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        // The glue around the matmuls (attention, norms, GELU, packing) is
        // compiled once per instruction set too, so that it vectorises as
        // wide as the kernel does.
        self.kernel.run(
            #[inline(always)]
            || self.forward(texts, parallel),
        )
    }

    /// Rows a text takes (tokens past the model's positions are cut).
    pub(crate) fn rows(&self, ids: &[u32]) -> usize {
        ids.len().min(self.max_positions)
    }

    #[inline(always)]
    fn forward(&self, texts: &[&[u32]], parallel: bool) -> Result<Vec<Vec<f32>>, EmbedError> {
        let h = self.hidden;
        let vocab = self.word.len() / h;
        // Each text's rows: (first row, rows).
        let mut segments = Vec::with_capacity(texts.len());
        let mut m = 0;
        for ids in texts {
            let rows = self.rows(ids);
            if rows == 0 {
                return Err(EmbedError("no tokens to embed".into()));
            }
            segments.push((m, rows));
            m += rows;
        }
        let mut x = vec![0f32; m * h];
        for (ids, &(start, rows)) in texts.iter().zip(&segments) {
            let text_rows = x[start * h..][..rows * h].chunks_exact_mut(h);
            for (i, (&id, row)) in ids.iter().zip(text_rows).enumerate() {
                let id = id as usize;
                if id >= vocab {
                    return Err(EmbedError(format!(
                        "token id {id} is outside the vocabulary"
                    )));
                }
                let word = &self.word[id * h..][..h];
                let pos = &self.position[i * h..][..h];
                for (((o, w), p), t) in row.iter_mut().zip(word).zip(pos).zip(&self.token_type) {
                    *o = w + p + t;
                }
            }
        }
        self.embed_norm.apply(&mut x);
        for layer in &self.layers {
            let qkv = self.linear(&layer.qkv, &x, m, parallel, Then::Nothing);
            let context = self.attend(&qkv, &segments, m, parallel);
            let then = Then::AddNorm(&x, &layer.attn_norm);
            let a = self.linear(&layer.attn_out, &context, m, parallel, then);
            let u = self.linear(&layer.up, &a, m, parallel, Then::Gelu);
            let then = Then::AddNorm(&a, &layer.out_norm);
            x = self.linear(&layer.down, &u, m, parallel, then);
        }
        let mut vectors = Vec::with_capacity(texts.len());
        for &(start, rows) in &segments {
            let mut pooled = vec![0f32; h];
            for row in x[start * h..][..rows * h].chunks_exact(h) {
                add(&mut pooled, row);
            }
            let norm = pooled.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
            // Mean then L2-normalise: the mean's 1/m cancels in the norm.
            for v in pooled.iter_mut() {
                *v /= norm;
            }
            vectors.push(pooled);
        }
        Ok(vectors)
    }

    /// Every text's self-attention. One text alone (`parallel`) has its
    /// query rows split over the threads.
    #[inline(always)]
    fn attend(
        &self,
        qkv: &[f32],
        segments: &[(usize, usize)],
        m: usize,
        parallel: bool,
    ) -> Vec<f32> {
        let h = self.hidden;
        let mut context = vec![0f32; m * h];
        if let ([(0, rows)], true) = (segments, parallel) {
            let share = rows.div_ceil(rayon::current_num_threads()).max(1);
            context
                .par_chunks_mut(share * h)
                .enumerate()
                .for_each(|(c, part)| {
                    let first = c * share;
                    self.kernel.run(
                        #[inline(always)]
                        || self.attention(qkv, *rows, first, part),
                    );
                });
            return context;
        }
        for &(start, rows) in segments {
            let qkv = &qkv[start * 3 * h..][..rows * 3 * h];
            self.attention(qkv, rows, 0, &mut context[start * h..][..rows * h]);
        }
        context
    }

    /// `x·Wᵀ + b`, then `then` on each output row. The rows are finished
    /// in parallel too: done alone, the glue between matmuls was a quarter
    /// of a query's time on two threads.
    #[inline(always)]
    fn linear(&self, l: &Linear, x: &[f32], m: usize, parallel: bool, then: Then<'_>) -> Vec<f32> {
        let (mr, nr) = (self.kernel.rows(m), self.kernel.columns());
        let k = l.k;
        let rows = m.div_ceil(mr) * mr;
        let xp = pack_rows(self.kernel, x, k, mr, rows);
        let mut out = vec![0f32; l.panels.len() / k * rows];
        let job = |(o, w): (&mut [f32], &[u16])| self.kernel.panel(mr, &xp, w, o, k, m);
        if parallel {
            out.par_chunks_mut(rows * nr)
                .zip(l.panels.par_chunks(k * nr))
                .for_each(job);
        } else {
            out.chunks_mut(rows * nr)
                .zip(l.panels.chunks(k * nr))
                .for_each(job);
        }
        // Panel-major `[panel][row][NR]` to row-major, plus the bias.
        let n = l.n;
        let mut y = vec![0f32; m * n];
        if parallel {
            let per_task = (m / rayon::current_num_threads() / 2).max(1);
            y.par_chunks_mut(n)
                .enumerate()
                .with_min_len(per_task)
                .for_each(|(r, yr)| {
                    self.kernel.run(
                        #[inline(always)]
                        || finish_row(l, &out, rows, nr, r, yr, then),
                    )
                });
        } else {
            for (r, yr) in y.chunks_exact_mut(n).enumerate() {
                finish_row(l, &out, rows, nr, r, yr, then);
            }
        }
        y
    }

    /// Self-attention over one text's `m` rows of `[q | k | v]`, for the
    /// query rows from `first` on that `context` holds; no mask, since one
    /// text has no padding.
    #[inline(always)]
    fn attention(&self, qkv: &[f32], m: usize, first: usize, context: &mut [f32]) {
        match self.hidden / self.heads {
            32 => self.attention_heads::<32>(qkv, m, first, context),
            64 => self.attention_heads::<64>(qkv, m, first, context),
            _ => self.attention_heads::<0>(qkv, m, first, context),
        }
    }

    /// Attention with heads of `D` dimensions (0: any, read at run time).
    /// A known `D` keeps a row's weighted sum in registers instead of
    /// storing it back at every key.
    #[inline(always)]
    fn attention_heads<const D: usize>(
        &self,
        qkv: &[f32],
        m: usize,
        first: usize,
        context: &mut [f32],
    ) {
        let h = self.hidden;
        let d = if D == 0 { h / self.heads } else { D };
        let scale = 1.0 / (d as f32).sqrt();
        let mut scores = vec![0f32; m];
        // This head's keys and values, gathered into rows of d.
        let (mut keys, mut values) = (vec![0f32; m * d], vec![0f32; m * d]);
        for head in 0..self.heads {
            for (j, (k, v)) in keys
                .chunks_exact_mut(d)
                .zip(values.chunks_exact_mut(d))
                .enumerate()
            {
                let row = &qkv[j * 3 * h..][..3 * h];
                k.copy_from_slice(&row[h + head * d..][..d]);
                v.copy_from_slice(&row[2 * h + head * d..][..d]);
            }
            for (i, out_row) in context.chunks_exact_mut(h).enumerate() {
                let q = &qkv[(first + i) * 3 * h + head * d..][..d];
                for (s, k) in scores.iter_mut().zip(keys.chunks_exact(d)) {
                    *s = dot(q, k) * scale;
                }
                // Softmax in three loops without a carried chain (a running
                // max or sum would keep each one scalar).
                let max = lanes8(&scores, f32::NEG_INFINITY, f32::max);
                for s in scores.iter_mut() {
                    *s = exp(*s - max);
                }
                let inv = 1.0 / lanes8(&scores, 0.0, |a, b| a + b);
                let out = &mut out_row[head * d..][..d];
                if D == 0 {
                    for (&p, v) in scores.iter().zip(values.chunks_exact(d)) {
                        for (o, v) in out.iter_mut().zip(v) {
                            *o += p * inv * v;
                        }
                    }
                } else {
                    let mut acc = [0f32; D];
                    for (&p, v) in scores.iter().zip(values.chunks_exact(D)) {
                        for (a, v) in acc.iter_mut().zip(v) {
                            *a += p * v;
                        }
                    }
                    for (o, a) in out.iter_mut().zip(acc) {
                        *o = a * inv;
                    }
                }
            }
        }
    }
}

/// Row `r` of a matmul's output, from the kernel's panel-major `out`
/// (`[panel][rows][nr]`) to `yr`, plus the bias, then `then`.
#[inline(always)]
fn finish_row(
    l: &Linear,
    out: &[f32],
    rows: usize,
    nr: usize,
    r: usize,
    yr: &mut [f32],
    then: Then<'_>,
) {
    let n = l.n;
    for (p, panel) in out.chunks_exact(rows * nr).enumerate() {
        let cols = nr.min(n - p * nr);
        let src = &panel[r * nr..][..cols];
        let bias = &l.bias[p * nr..][..cols];
        for ((d, s), b) in yr[p * nr..][..cols].iter_mut().zip(src).zip(bias) {
            *d = s + b;
        }
    }
    match then {
        Then::Nothing => {}
        Then::Gelu => {
            for v in yr.iter_mut() {
                *v = gelu(*v);
            }
        }
        Then::AddNorm(residual, norm) => {
            add(yr, &residual[r * n..][..n]);
            norm.apply(yr);
        }
    }
}

/// What [`Encoder::linear`] does to each output row after the bias.
#[derive(Clone, Copy)]
enum Then<'a> {
    Nothing,
    Gelu,
    /// Add the residual's row, then normalise.
    AddNorm(&'a [f32], &'a Norm),
}

/// Runs `f` compiled for AVX2: a closure handed to rayon is compiled on its
/// own, without its caller's target features, unless inlined into one.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// [`run_avx2`] for AVX-512.
///
/// # Safety
/// The CPU must have AVX-512F and VL, AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn run_avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// Activations packed for the kernel, `rows` rows (zero past the real ones).
enum Packed {
    /// `[block][k][MR]`.
    F32(Vec<f32>),
    /// `[rows][k]` bfloat16 bits, for AMX.
    Bf16Rows(Vec<u16>),
}

#[inline(always)]
fn pack_rows(kernel: Kernel, x: &[f32], k: usize, mr: usize, rows: usize) -> Packed {
    if kernel.pairs() {
        let mut xp = vec![0u16; rows * k];
        for (d, &v) in xp.iter_mut().zip(x) {
            *d = bf16_bits(v);
        }
        return Packed::Bf16Rows(xp);
    }
    let mut xp = vec![0f32; rows * k];
    for (r, row) in x.chunks_exact(k).enumerate() {
        let base = (r / mr) * mr * k + r % mr;
        for (kk, &v) in row.iter().enumerate() {
            xp[base + kk * mr] = v;
        }
    }
    Packed::F32(xp)
}

impl Linear {
    /// Packs PyTorch's `[n][k]` weight into `[n / nr][k][nr]` panels, or the
    /// bf16 kernel's `[n / nr][k / 2][nr][2]`.
    fn pack(w: &[f32], bias: Vec<f32>, k: usize, kernel: Kernel) -> Self {
        let nr = kernel.columns();
        let n = bias.len();
        let panels_n = n.div_ceil(nr);
        let pairs = kernel.pairs();
        let mut panels = vec![0u16; panels_n * k * nr];
        for col in 0..n {
            let (p, j) = (col / nr, col % nr);
            for kk in 0..k {
                let v = w[col * k + kk];
                let at = if pairs {
                    ((p * k / 2 + kk / 2) * nr + j) * 2 + kk % 2
                } else {
                    (p * k + kk) * nr + j
                };
                panels[at] = if pairs {
                    bf16_bits(v)
                } else {
                    half::f16::from_f32(v).to_bits()
                };
            }
        }
        Self { panels, bias, k, n }
    }
}

impl Norm {
    #[inline(always)]
    fn apply(&self, x: &mut [f32]) {
        let h = self.weight.len();
        for row in x.chunks_exact_mut(h) {
            let mean = row.iter().sum::<f32>() / h as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / h as f32;
            let inv = 1.0 / (var + self.eps).sqrt();
            for ((v, w), b) in row.iter_mut().zip(&self.weight).zip(&self.bias) {
                *v = (*v - mean) * inv * w + b;
            }
        }
    }
}

/// BERT's GELU, `x·Φ(x)`, with erf from Abramowitz and Stegun 7.1.26
/// (absolute error below 1.5e-7, far under f32 rounding of the activations;
/// libm's exact erff took a fifth of the forward pass).
#[inline(always)]
fn gelu(x: f32) -> f32 {
    let z = (x * std::f32::consts::FRAC_1_SQRT_2).abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * z);
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_8 + t * (-1.453_152 + t * 1.061_405_4))));
    let erf = (1.0 - poly * exp(-z * z)).copysign(x);
    0.5 * x * (1.0 + erf)
}

/// `e^x` for x ≤ 0 in plain arithmetic, so that loops over it vectorise
/// (a libm call per element does not): `2^n · 2^f` with n = round(x·log2 e),
/// |f| ≤ 0.5, and 2^f by its Taylor series to the 7th term. Relative error
/// about 3e-7 · (1 + |x|), from the range reduction done in f32; GELU only
/// needs it where e^x is above 1e-7 anyway.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2²³
    let y = x.max(-87.0) * std::f32::consts::LOG2_E;
    // Round to nearest by adding 1.5·2²³: the sum's low mantissa bits are
    // then n itself, so 2ⁿ needs no float-to-int conversion (Rust's `as`
    // saturates, which keeps the loop from vectorising).
    let t = y + MAGIC;
    let n = t - MAGIC;
    let f = (y - n) * std::f32::consts::LN_2;
    let p = 1.0
        + f * (1.0
            + f * (0.5 + f * (1.0 / 6.0 + f * (1.0 / 24.0 + f * (1.0 / 120.0 + f / 720.0)))));
    let n_bits = t.to_bits().wrapping_sub(MAGIC.to_bits());
    p * f32::from_bits(n_bits.wrapping_add(127) << 23)
}

/// `xs` folded with `f` in eight independent lanes, then across them, so
/// that the loop vectorises instead of waiting on one chain.
#[inline(always)]
fn lanes8(xs: &[f32], init: f32, f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut lanes = [init; 8];
    let chunks = xs.chunks_exact(8);
    let tail = chunks.remainder().iter().fold(init, |a, &b| f(a, b));
    for c in chunks {
        for i in 0..8 {
            lanes[i] = f(lanes[i], c[i]);
        }
    }
    lanes.into_iter().fold(tail, f)
}

/// Eight independent sums, so that the loop vectorises instead of waiting
/// on one chain of additions.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = (a8.remainder().iter().zip(b8.remainder()))
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

#[inline(always)]
fn add(acc: &mut [f32], x: &[f32]) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}

/// f32 to bfloat16 bits, rounding to nearest even; branch-free so that it
/// vectorises (weights and activations are finite, so NaN needs no care).
#[inline(always)]
fn bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// A little-endian F32 tensor by name, checked against `dims` (0 = any). F16
/// and BF16 files (half the size, as the shipped fine-tuned weights are) are
/// widened to f32 at load; the forward pass is the same.
fn read_f32(st: &SafeTensors<'_>, name: &str, dims: &[usize]) -> Result<Vec<f32>, EmbedError> {
    let t = st
        .tensor(name)
        .map_err(|e| EmbedError(format!("model.safetensors has no {name}: {e}")))?;
    let widen: fn([u8; 2]) -> f32 = match t.dtype() {
        Dtype::F32 => |_| 0.0,
        Dtype::F16 => |b| half::f16::from_le_bytes(b).to_f32(),
        Dtype::BF16 => |b| half::bf16::from_le_bytes(b).to_f32(),
        other => {
            return Err(EmbedError(format!(
                "{name} is {other:?}, not F32, F16 or BF16"
            )));
        }
    };
    let shape = t.shape();
    let fits = shape.len() == dims.len() && shape.iter().zip(dims).all(|(&s, &d)| d == 0 || s == d);
    if !fits {
        return Err(EmbedError(format!(
            "{name} has shape {shape:?}, expected {dims:?}"
        )));
    }
    Ok(match t.dtype() {
        Dtype::F32 => t
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        _ => t
            .data()
            .chunks_exact(2)
            .map(|b| widen([b[0], b[1]]))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn half_precision_tensors_are_widened_at_load() {
        use safetensors::tensor::TensorView;
        let values = [1.5f32, -0.25, 3.0e-3];
        let f16: Vec<u8> = values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect();
        let f32: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let i64: Vec<u8> = [1i64, 2, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
        let tensors = [
            (
                "h",
                TensorView::new(super::Dtype::F16, vec![3], &f16).unwrap(),
            ),
            (
                "f",
                TensorView::new(super::Dtype::F32, vec![3], &f32).unwrap(),
            ),
            (
                "i",
                TensorView::new(super::Dtype::I64, vec![3], &i64).unwrap(),
            ),
        ];
        let bytes = safetensors::serialize(tensors, None).unwrap();
        let st = super::SafeTensors::deserialize(&bytes).unwrap();
        let widened = super::read_f32(&st, "h", &[3]).unwrap();
        for (w, v) in widened.iter().zip(values) {
            assert!((w - v).abs() <= v.abs() * 1e-3, "{w} vs {v}");
        }
        assert_eq!(super::read_f32(&st, "f", &[0]).unwrap(), values);
        assert!(
            super::read_f32(&st, "i", &[3])
                .unwrap_err()
                .0
                .contains("I64")
        );
        assert!(super::read_f32(&st, "f", &[4]).is_err());
    }

    #[test]
    fn exp_matches_std_over_the_range_it_serves() {
        let mut x = -87.0f32;
        while x <= 0.0 {
            let (ours, std) = (super::exp(x), x.exp());
            // The range reduction's rounding grows with |x|.
            let tolerance = 3e-7 * (1.0 + x.abs());
            assert!(
                (ours - std).abs() <= tolerance * std,
                "{x}: {ours} vs {std}"
            );
            x += 0.013;
        }
    }

    #[test]
    fn gelu_matches_the_exact_erf_form() {
        let mut x = -8.0f32;
        while x <= 8.0 {
            let exact = 0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2));
            assert!((super::gelu(x) - exact).abs() < 1e-6, "{x}");
            x += 0.001;
        }
    }
}
