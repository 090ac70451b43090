//! Where a cold run's time goes: runtime, context, prelude, script.
use std::time::Instant;

use rquickjs::{Context, Runtime};

fn main() {
    let n = 300;
    let (mut rt_t, mut ctx_t, mut eval_t) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        let rt = Runtime::new().unwrap();
        rt_t.push(t.elapsed());
        let t = Instant::now();
        let ctx = Context::full(&rt).unwrap();
        ctx_t.push(t.elapsed());
        let t = Instant::now();
        ctx.with(|ctx| {
            rquickjs::Module::declare(ctx, "prelude", include_str!("../src/prelude.js")).unwrap();
        });
        eval_t.push(t.elapsed());
    }
    for (name, mut v) in [
        ("runtime", rt_t),
        ("context full", ctx_t),
        ("prelude eval", eval_t),
    ] {
        v.sort();
        println!("{name:<14} p50 {:>6.0} µs", v[n / 2].as_secs_f64() * 1e6);
    }
    let rt = Runtime::new().unwrap();
    let mut v = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let ctx = Context::full(&rt).unwrap();
        ctx.with(|ctx| {
            rquickjs::Module::declare(ctx, "prelude", include_str!("../src/prelude.js")).unwrap();
        });
        drop(ctx);
        v.push(t.elapsed());
    }
    v.sort();
    println!(
        "{:<14} p50 {:>6.0} µs",
        "ctx+prelude on a reused runtime",
        v[n / 2].as_secs_f64() * 1e6
    );
}
