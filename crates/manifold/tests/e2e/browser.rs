//! The console's browser stories: `tests/browser/stories.mjs` drives headless
//! Debian `chromium` (playwright-core, `executablePath`) against a real
//! `manifold serve` with real fixture upstreams. Screenshots land in
//! `<target>/tmp/browser-stories/`. `scripts/install-test-deps.sh` installs
//! chromium and playwright-core.

use crate::common;

use std::{path::PathBuf, process::Command};

use common::{fixture_bin, manifold_bin};

#[test]
fn browser_stories() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let script = root.join("tests/browser/stories.mjs");
    let screenshots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("browser-stories");
    let status = Command::new("node")
        .arg(&script)
        .env("MANIFOLD_BIN", manifold_bin())
        .env("MANIFOLD_FIXTURE_BIN", fixture_bin())
        .env("SCREENSHOT_DIR", &screenshots)
        .status()
        .expect("node runs (install Node 20+)");
    assert!(
        status.success(),
        "browser stories failed ({status}); screenshots in {}",
        screenshots.display()
    );
}
