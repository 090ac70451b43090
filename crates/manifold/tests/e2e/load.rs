//! The short load suite: `manifold-bench load` against a real gateway on
//! loopback, bounded in time. It asserts behaviour, not speed: no failures
//! below admission capacity, only clean 503 `tool_discovery_busy` above it,
//! and a gateway whose memory stays flat under steady traffic.

use crate::common;

use common::bench_bin;
use serde_json::Value;

#[test]
fn load_below_and_above_capacity_and_a_short_soak() {
    let dir = tempfile::tempdir().unwrap();
    let report_path = dir.path().join("load.json");
    let out = std::process::Command::new(bench_bin())
        .args([
            "load",
            "--seconds",
            "4",
            "--concurrency",
            "4",
            "--overload",
            "48",
            "--soak-seconds",
            "20",
            "--sample-ms",
            "1000",
            "--json",
        ])
        .arg(&report_path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{stdout}");
    let report: Value = serde_json::from_slice(&std::fs::read(&report_path).unwrap()).unwrap();

    for phase in ["gateway", "direct"] {
        let p = &report[phase];
        assert!(p["requests"].as_u64().unwrap() > 0, "{phase}: {p}");
        assert_eq!(p["other"], 0, "{phase}: {p}");
        assert_eq!(
            p["busy"], 0,
            "{phase}: below capacity nothing is refused: {p}"
        );
        assert_eq!(p["ok"], p["requests"], "{phase}: {p}");
    }

    let overload = &report["overload"];
    assert_eq!(overload["other"], 0, "only clean refusals: {overload}");
    assert!(overload["busy"].as_u64().unwrap() > 0, "{overload}");
    assert!(
        overload["ok"].as_u64().unwrap() > 0,
        "some still served: {overload}"
    );

    let soak = &report["soak"];
    assert_eq!(soak["phase"]["other"], 0, "{soak}");
    assert!(soak["rss_kib"].as_array().unwrap().len() >= 10, "{soak}");
    let growth = soak["growth"].as_f64().unwrap();
    assert!(
        growth < 1.25,
        "RSS grew by {growth:.3}× from the second to the last quarter"
    );
}
