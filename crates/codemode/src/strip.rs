//! TypeScript in, JavaScript out: the model's script with its types removed
//! by oxc, or a syntax error pointing at the problem, before anything runs.
//!
//! The script may `await` and `return` at the top level. It is parsed as a
//! module that allows `return` outside functions; the sandbox runs the
//! result inside an async function, so both mean what the model expects.

use std::{fmt, path::Path};

use oxc_allocator::Allocator;
use oxc_codegen::Codegen;
use oxc_parser::{ParseOptions, Parser};
use oxc_semantic::SemanticBuilder;
use oxc_span::SourceType;
use oxc_transformer::{TransformOptions, Transformer};

/// A syntax error with its place in the script and a caret under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    pub message: String,
    /// 1-based.
    pub line: usize,
    /// 1-based, in characters.
    pub column: usize,
    /// The offending line and a caret line under it.
    pub snippet: String,
}

impl fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SyntaxError: {} (line {}, column {})\n{}",
            self.message, self.line, self.column, self.snippet
        )
    }
}

impl std::error::Error for SyntaxError {}

/// `source` with TypeScript syntax removed (enums and class fields become
/// plain JavaScript), or the first syntax error.
pub fn strip_types(source: &str) -> Result<String, SyntaxError> {
    let allocator = Allocator::default();
    let source_type = SourceType::ts().with_module(true);
    let options = ParseOptions {
        allow_return_outside_function: true,
        ..ParseOptions::default()
    };
    let parsed = Parser::new(&allocator, source, source_type)
        .with_options(options)
        .parse();
    if let Some(error) = parsed.diagnostics.errors().next() {
        let offset = error
            .labels
            .first()
            .map(|label| label.offset())
            .unwrap_or(0);
        return Err(located(source, offset, error.message.to_string()));
    }
    if parsed.panicked {
        return Err(located(source, 0, "the script could not be parsed".into()));
    }
    let mut program = parsed.program;
    let scoping = SemanticBuilder::new()
        .with_enum_eval(true)
        .build(&program)
        .semantic
        .into_scoping();
    let transformed = Transformer::new(
        &allocator,
        Path::new("script.ts"),
        &TransformOptions::default(),
    )
    .build_with_scoping(scoping, &mut program);
    if let Some(error) = transformed.diagnostics.errors().next() {
        let offset = error.labels.first().map(|l| l.offset()).unwrap_or(0);
        return Err(located(source, offset, error.message.to_string()));
    }
    Ok(Codegen::new().build(&program).code)
}

/// The line and column of byte `offset`, with the line and a caret.
fn located(source: &str, offset: u32, message: String) -> SyntaxError {
    let offset = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(source.len());
    let before = &source[..source.floor_char_boundary(offset)];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    let text = source[line_start..].lines().next().unwrap_or("");
    let snippet = format!("{text}\n{}^", " ".repeat(column - 1));
    SyntaxError {
        message,
        line,
        column,
        snippet,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_enums_generics_and_class_fields_are_stripped() {
        let js = strip_types(
            "enum Level { Low = 1, High }\n\
             interface Row { id: number; level: Level }\n\
             class Box<T> { value: T; constructor(v: T) { this.value = v; } }\n\
             function first<T>(xs: T[]): T | undefined { return xs[0]; }\n\
             const rows: Row[] = [{ id: 1, level: Level.High }];\n\
             const b = new Box<number>(first(rows.map((r: Row) => r.id))!);\n\
             const answer = await Promise.resolve(b.value as number);\n\
             return answer;\n",
        )
        .unwrap();
        assert!(!js.contains("interface"), "{js}");
        assert!(!js.contains(": Row"), "{js}");
        assert!(js.contains("Level"), "the enum becomes an object: {js}");
        assert!(js.contains("return answer"), "{js}");
        assert!(js.contains("await Promise.resolve"), "{js}");
    }

    #[test]
    fn a_syntax_error_says_where_with_a_caret() {
        let error = strip_types("const a = 1;\nconst b = (2 + ;\n").unwrap_err();
        assert_eq!(error.line, 2, "{error}");
        assert_eq!(
            error.snippet, "const b = (2 + ;\n               ^",
            "{error}"
        );
        assert!(error.to_string().starts_with("SyntaxError: "), "{error}");
    }
}
