//! What a tool result may carry to the model: secrets are masked and long
//! text is cut, on every path a result takes (the broker applies this to
//! every forwarded call, so `call_tool`, direct mode and code mode alike).
//!
//! Masking replaces a secret with `[masked:KIND]`; nothing of it is kept,
//! counted or logged but its kind. It covers every string of what comes
//! back, `_meta` included. An object key that holds a secret becomes
//! `[masked:KIND#N]`, N counting such keys in that object so keys stay
//! unique; the value under it, and the rest of the structure, keep their
//! shape. `structuredContent` is masked value by value, so a result that
//! matched its `outputSchema` still does; it is never cut, and is refused
//! instead when it is larger than the limit. Blob contents (a resource's
//! `blob`, an image's or audio's `data`) are bounded by size upstream
//! (`max_result_bytes`), never read.
//!
//! Results other than a tool's (`resources/read`, `prompts/get`,
//! `completion/complete`, input requests, relayed messages) are guarded as
//! JSON by [`Guardrails::guard_returned`]: every string masked, `text`
//! strings cut against the same `max_result_chars` budget, completion values
//! past the budget dropped.

use std::{collections::BTreeMap, sync::LazyLock};

use regex::{Regex, RegexSet};
use rmcp::{
    ErrorData,
    model::{CallToolResult, CompleteResult, ContentBlock, ResourceContents},
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

/// Result guardrails, from `[governance]` (and per server `max_result_chars`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guardrails {
    /// Mask secrets in results (on by default).
    pub mask_secrets: bool,
    /// Cut text content past this many characters; 0: no limit.
    pub max_result_chars: usize,
}

impl Default for Guardrails {
    fn default() -> Self {
        Guardrails {
            mask_secrets: true,
            max_result_chars: 0,
        }
    }
}

/// What the guardrails did to one result, for metrics and the audit.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GuardReport {
    /// Secrets masked, by kind.
    pub masked: BTreeMap<&'static str, usize>,
    /// Characters of text content cut.
    pub truncated_chars: usize,
    /// The structured result was over the limit, and the result refused.
    pub refused_structured_chars: Option<usize>,
}

impl GuardReport {
    pub fn is_empty(&self) -> bool {
        self.masked.is_empty()
            && self.truncated_chars == 0
            && self.refused_structured_chars.is_none()
    }

    /// Adds another guard's findings (e.g. an error's) to this one.
    pub fn merge(&mut self, other: GuardReport) {
        merge(&mut self.masked, other.masked);
        self.truncated_chars += other.truncated_chars;
        self.refused_structured_chars = self
            .refused_structured_chars
            .or(other.refused_structured_chars);
    }

    /// The metrics of what was masked and cut.
    fn count(&self) {
        for (kind, count) in &self.masked {
            metrics::counter!("manifold_result_secrets_masked_total", "kind" => *kind)
                .increment(*count as u64);
        }
        if self.truncated_chars > 0 {
            metrics::counter!("manifold_result_truncated_total").increment(1);
        }
    }

    /// The audit's view: kinds and counts, never a secret.
    pub fn to_json(&self) -> Value {
        let mut out = serde_json::Map::new();
        if !self.masked.is_empty() {
            out.insert("masked".into(), serde_json::json!(self.masked));
        }
        if self.truncated_chars > 0 {
            out.insert("truncated_chars".into(), self.truncated_chars.into());
        }
        if let Some(chars) = self.refused_structured_chars {
            out.insert("refused_structured_chars".into(), chars.into());
        }
        Value::Object(out)
    }
}

/// The secrets looked for: a kind, and a pattern whose group `s` (or the
/// whole match) is the secret.
const SECRETS: &[(&str, &str)] = &[
    (
        "private_key",
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY-----",
    ),
    ("aws_access_key", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    (
        "aws_secret_key",
        r#"(?i)aws_?secret_?(?:access_?)?key["']?\s*[:=]\s*["']?(?P<s>[A-Za-z0-9/+=]{40})"#,
    ),
    ("google_api_key", r"\bAIza[0-9A-Za-z_\-]{35}\b"),
    (
        "azure_storage_key",
        r"(?i)AccountKey=(?P<s>[A-Za-z0-9+/=]{40,})",
    ),
    (
        "github_token",
        r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36,255}\b",
    ),
    ("github_token", r"\bgithub_pat_[A-Za-z0-9_]{22,255}\b"),
    ("slack_token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}\b"),
    (
        "slack_webhook",
        r"https://hooks\.slack\.com/services/[A-Za-z0-9_/]+",
    ),
    ("stripe_key", r"\b(?:sk|rk)_live_[0-9A-Za-z]{20,}\b"),
    ("anthropic_key", r"\bsk-ant-[A-Za-z0-9_\-]{20,}"),
    ("openai_key", r"\bsk-(?:proj-)?[A-Za-z0-9_\-]{32,}"),
    (
        "jwt",
        r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
    ),
    (
        "connection_string",
        r"\b[a-zA-Z][a-zA-Z0-9+.-]{1,20}://[^\s:/@]+:(?P<s>[^\s@/]+)@[^\s/]+",
    ),
];

struct Patterns {
    any: RegexSet,
    each: Vec<(&'static str, Regex)>,
}

static PATTERNS: LazyLock<Patterns> = LazyLock::new(|| Patterns {
    any: RegexSet::new(SECRETS.iter().map(|(_, p)| *p)).expect("secret patterns compile"),
    each: SECRETS
        .iter()
        .map(|(kind, p)| (*kind, Regex::new(p).expect("secret pattern compiles")))
        .collect(),
});

/// `text` with every secret replaced by `[masked:KIND]`, and the count by
/// kind added to `masked`. Text without a secret is returned as it is.
pub fn mask_text(text: &str, masked: &mut BTreeMap<&'static str, usize>) -> Option<String> {
    let patterns = &*PATTERNS;
    // Most text holds no secret: a plain scan that stops at the first hit
    // is cheaper than the overlapping one that names every kind.
    if !patterns.any.is_match(text) {
        return None;
    }
    let hits = patterns.any.matches(text);
    let mut out = text.to_string();
    for index in hits.iter() {
        let (kind, regex) = &patterns.each[index];
        let mut count = 0;
        out = regex
            .replace_all(&out, |caps: &regex::Captures| {
                count += 1;
                let whole = caps.get(0).expect("a match has group 0");
                match caps.name("s") {
                    Some(secret) => {
                        let start = secret.start() - whole.start();
                        let end = secret.end() - whole.start();
                        let text = whole.as_str();
                        format!("{}[masked:{kind}]{}", &text[..start], &text[end..])
                    }
                    None => format!("[masked:{kind}]"),
                }
            })
            .into_owned();
        if count > 0 {
            *masked.entry(kind).or_default() += count;
        }
    }
    Some(out)
}

/// Masks every string and key in a JSON value, leaving its shape (and so
/// its validity against a schema of strings) as it was.
pub fn mask_value(value: &mut Value, masked: &mut BTreeMap<&'static str, usize>) {
    match value {
        Value::String(s) => {
            if let Some(clean) = mask_text(s, masked) {
                *s = clean;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| mask_value(v, masked)),
        Value::Object(map) => {
            mask_keys(map, masked);
            map.values_mut().for_each(|v| mask_value(v, masked));
        }
        _ => {}
    }
}

/// Renames each key of `map` that holds a secret to `[masked:KIND#N]`
/// (KIND the first kind found in it), N the lowest number from 1 up that
/// no other key of `map` has; the values stay under their new keys.
fn mask_keys(map: &mut serde_json::Map<String, Value>, masked: &mut BTreeMap<&'static str, usize>) {
    let patterns = &*PATTERNS;
    let secret_keys: Vec<String> = map
        .keys()
        .filter(|k| patterns.any.is_match(k))
        .cloned()
        .collect();
    let mut n = 0;
    for key in secret_keys {
        let mut kinds = BTreeMap::new();
        if mask_text(&key, &mut kinds).is_none() {
            continue;
        }
        let kind = patterns
            .each
            .iter()
            .map(|(kind, _)| *kind)
            .find(|kind| kinds.contains_key(kind))
            .unwrap_or("secret");
        for (kind, count) in kinds {
            *masked.entry(kind).or_default() += count;
        }
        let value = map.remove(&key).expect("a key just listed");
        let renamed = loop {
            n += 1;
            let candidate = format!("[masked:{kind}#{n}]");
            if !map.contains_key(&candidate) {
                break candidate;
            }
        };
        map.insert(renamed, value);
    }
}

/// Where [`guard_json`] is in a result: what the budget of `text` is, and
/// whether strings are masked.
struct Walk<'a> {
    mask: bool,
    max_chars: usize,
    budget: usize,
    report: &'a mut GuardReport,
}

impl Walk<'_> {
    fn string(&mut self, s: &mut String, is_text: bool) {
        if self.mask
            && let Some(clean) = mask_text(s, &mut self.report.masked)
        {
            *s = clean;
        }
        if is_text {
            self.report.truncated_chars += cut(s, &mut self.budget, self.max_chars);
        }
    }

    fn value(&mut self, value: &mut Value, is_text: bool) {
        match value {
            Value::String(s) => self.string(s, is_text),
            Value::Array(items) => items.iter_mut().for_each(|v| self.value(v, false)),
            Value::Object(map) => self.object(map),
            _ => {}
        }
    }

    fn object(&mut self, map: &mut serde_json::Map<String, Value>) {
        if self.mask {
            mask_keys(map, &mut self.report.masked);
        }
        // Blob contents are bounded by size upstream, not read.
        let binary = matches!(
            map.get("type").and_then(Value::as_str),
            Some("image" | "audio")
        );
        for (key, value) in map.iter_mut() {
            match key.as_str() {
                "blob" => continue,
                "data" if binary => continue,
                "text" => self.value(value, true),
                _ => self.value(value, false),
            }
        }
    }

    /// Completion values past the budget are dropped, not cut: each is
    /// offered whole or not at all.
    fn completion_values(&mut self, values: &mut Vec<String>) {
        let mut kept = Vec::with_capacity(values.len());
        for mut value in values.drain(..) {
            self.string(&mut value, false);
            let chars = value.chars().count();
            if chars > self.budget {
                self.report.truncated_chars += chars;
                self.budget = 0;
                continue;
            }
            self.budget -= chars;
            kept.push(value);
        }
        *values = kept;
    }
}

/// Cuts `text` past what is left of `budget`, with a marker; returns the
/// characters cut.
fn cut(text: &mut String, budget: &mut usize, max_chars: usize) -> usize {
    let chars = text.chars().count();
    if chars <= *budget {
        *budget -= chars;
        return 0;
    }
    let keep = *budget;
    let cut = chars - keep;
    let at = text.char_indices().nth(keep).map_or(text.len(), |(i, _)| i);
    text.truncate(at);
    text.push_str(&format!(
        "\n[truncated: {cut} of {chars} characters cut; the limit is {max_chars} (max_result_chars)]"
    ));
    *budget = 0;
    cut
}

impl Guardrails {
    /// Applies the guardrails to `result` in place. `max_chars` is the
    /// limit for this server (its own, else the global one; 0: none).
    pub fn apply(&self, result: &mut CallToolResult, max_chars: usize) -> GuardReport {
        let mut report = GuardReport::default();
        if let Some(structured) = &mut result.structured_content {
            if self.mask_secrets {
                mask_value(structured, &mut report.masked);
            }
            if max_chars > 0 {
                let chars = structured.to_string().chars().count();
                if chars > max_chars {
                    report.refused_structured_chars = Some(chars);
                    *result = CallToolResult::error(vec![ContentBlock::text(format!(
                        "the tool's structured result has {chars} characters, over this \
                         server's limit of {max_chars} (max_result_chars); a structured \
                         result is never cut, so it was not passed on"
                    ))]);
                    return report;
                }
            }
        }
        let mut budget = if max_chars > 0 { max_chars } else { usize::MAX };
        for content in &mut result.content {
            let text = match content {
                ContentBlock::Text(t) => &mut t.text,
                ContentBlock::Resource(r) => match &mut r.resource {
                    ResourceContents::TextResourceContents { text, .. } => text,
                    _ => continue,
                },
                _ => continue,
            };
            if self.mask_secrets
                && let Some(clean) = mask_text(text, &mut report.masked)
            {
                *text = clean;
            }
            let chars = text.chars().count();
            if chars <= budget {
                budget -= chars;
                continue;
            }
            let keep = budget;
            let cut = chars - keep;
            let at = text.char_indices().nth(keep).map_or(text.len(), |(i, _)| i);
            text.truncate(at);
            text.push_str(&format!(
                "\n[truncated: {cut} of {chars} characters cut; the limit is {max_chars} (max_result_chars)]"
            ));
            report.truncated_chars += cut;
            budget = 0;
        }
        if self.mask_secrets {
            self.mask_rest(result, &mut report);
        }
        report.count();
        report
    }

    /// The strings of a tool result that are not its text: `_meta`, and
    /// every other field of its content blocks (blobs excepted).
    fn mask_rest(&self, result: &mut CallToolResult, report: &mut GuardReport) {
        if let Some(meta) = &mut result.meta {
            mask_map(&mut meta.0, &mut report.masked);
        }
        for content in &mut result.content {
            if let ContentBlock::Text(text) = content {
                if let Some(meta) = &mut text.meta {
                    mask_map(&mut meta.0, &mut report.masked);
                }
                continue;
            }
            // Rare enough to go through JSON; text was cut above already.
            let mask_only = Guardrails {
                mask_secrets: true,
                max_result_chars: 0,
            };
            match mask_only.guard_returned(content, 0) {
                Ok(more) => merge(&mut report.masked, more.masked),
                Err(_) => *content = ContentBlock::text("[masked:unreadable_content]"),
            }
        }
    }

    /// Guards any result other than a tool's, as JSON: every string masked
    /// but blob contents, `text` cut against `max_chars` (0: no limit).
    /// `Err` when the guarded JSON no longer reads as `T`; it must then not
    /// be passed on.
    pub fn guard_returned<T: Serialize + DeserializeOwned>(
        &self,
        item: &mut T,
        max_chars: usize,
    ) -> Result<GuardReport, String> {
        let mut report = GuardReport::default();
        if !self.mask_secrets && max_chars == 0 {
            return Ok(report);
        }
        let mut value = serde_json::to_value(&*item).map_err(|e| e.to_string())?;
        self.walk(max_chars, &mut report).value(&mut value, false);
        if !report.is_empty() {
            *item = serde_json::from_value(value).map_err(|e| e.to_string())?;
        }
        report.count();
        Ok(report)
    }

    /// A completion's values are masked, and those past `max_chars` dropped
    /// (whole); its `_meta` is masked.
    pub fn guard_completion(&self, result: &mut CompleteResult, max_chars: usize) -> GuardReport {
        let mut report = GuardReport::default();
        let mut walk = self.walk(max_chars, &mut report);
        walk.completion_values(&mut result.completion.values);
        if let Some(meta) = &mut result.meta {
            walk.object(&mut meta.0);
        }
        report.count();
        report
    }

    /// An upstream's JSON-RPC error: its message and data masked.
    pub fn guard_error(&self, error: &mut ErrorData) -> GuardReport {
        let mut report = GuardReport::default();
        if !self.mask_secrets {
            return report;
        }
        if let Some(clean) = mask_text(&error.message, &mut report.masked) {
            error.message = clean.into();
        }
        if let Some(data) = &mut error.data {
            self.walk(0, &mut report).value(data, false);
        }
        report.count();
        report
    }

    fn walk<'a>(&self, max_chars: usize, report: &'a mut GuardReport) -> Walk<'a> {
        Walk {
            mask: self.mask_secrets,
            max_chars,
            budget: if max_chars > 0 { max_chars } else { usize::MAX },
            report,
        }
    }
}

fn mask_map(map: &mut serde_json::Map<String, Value>, masked: &mut BTreeMap<&'static str, usize>) {
    mask_keys(map, masked);
    map.values_mut().for_each(|v| mask_value(v, masked));
}

fn merge(into: &mut BTreeMap<&'static str, usize>, from: BTreeMap<&'static str, usize>) {
    for (kind, count) in from {
        *into.entry(kind).or_default() += count;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn masked(text: &str) -> (String, BTreeMap<&'static str, usize>) {
        let mut counts = BTreeMap::new();
        let out = mask_text(text, &mut counts).unwrap_or_else(|| text.to_string());
        (out, counts)
    }

    #[test]
    fn every_kind_of_secret_is_masked_and_nothing_else() {
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U";
        let cases = [
            ("key AKIAIOSFODNN7EXAMPLE here", "aws_access_key"),
            (
                "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                "aws_secret_key",
            ),
            ("AIzaSyA-1234567890abcdefghijklmnopqrstu", "google_api_key"),
            (
                "DefaultEndpointsProtocol=https;AccountName=x;AccountKey=Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFy;",
                "azure_storage_key",
            ),
            ("ghp_0123456789abcdefghijABCDEFGHIJ012345", "github_token"),
            (
                "github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
                "github_token",
            ),
            ("xoxb-1234567890-abcdefghij", "slack_token"),
            (
                "https://hooks.slack.com/services/T000/B000/XXXXXXXX",
                "slack_webhook",
            ),
            ("sk_live_0123456789abcdefghijABCD", "stripe_key"),
            ("sk-ant-api03-abcdefghijklmnopqrstuvwxyz", "anthropic_key"),
            (
                "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789AB",
                "openai_key",
            ),
            (jwt, "jwt"),
            (
                "postgres://app:hunter2@db.internal:5432/prod",
                "connection_string",
            ),
            (
                "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
                "private_key",
            ),
        ];
        for (text, kind) in cases {
            let (out, counts) = masked(text);
            assert!(out.contains(&format!("[masked:{kind}]")), "{kind}: {out}");
            assert_eq!(counts.get(kind), Some(&1), "{kind}: {counts:?}");
        }
        // The connection string keeps everything but the password.
        let (out, _) = masked("postgres://app:hunter2@db.internal:5432/prod");
        assert_eq!(
            out,
            "postgres://app:[masked:connection_string]@db.internal:5432/prod"
        );
        assert!(
            !masked(
                "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----"
            )
            .0
            .contains("MIIE")
        );
        // Ordinary text is left alone.
        for text in [
            "The meeting is at 10:00. See https://example.com/docs.",
            "commit 3f9e1c2 fixed the AKIA parser",
            "user@example.com wrote: http://example.com:8080/path",
            "skip-this-step and sk-short",
        ] {
            assert_eq!(masked(text).1, BTreeMap::new(), "{text}");
        }
    }

    #[test]
    fn structured_content_is_masked_value_by_value_and_refused_when_too_large() {
        let guard = Guardrails {
            mask_secrets: true,
            max_result_chars: 0,
        };
        let mut result = CallToolResult::structured(json!({
            "token": "ghp_0123456789abcdefghijABCDEFGHIJ012345",
            "nested": [{"url": "mysql://root:pw123@10.0.0.1/db"}, 3, true],
        }));
        let report = guard.apply(&mut result, 0);
        let structured = result.structured_content.clone().unwrap();
        assert_eq!(structured["token"], "[masked:github_token]");
        assert_eq!(
            structured["nested"][0]["url"],
            "mysql://root:[masked:connection_string]@10.0.0.1/db"
        );
        assert_eq!(structured["nested"][1], 3);
        // `structured` also carries the JSON as text: both copies are masked.
        assert_eq!(report.masked["github_token"], 2);
        assert!(!result.content[0].as_text().unwrap().text.contains("ghp_"));
        assert!(!report.to_json().to_string().contains("ghp_"));

        let mut big = CallToolResult::structured(json!({"rows": "x".repeat(500)}));
        let report = guard.apply(&mut big, 100);
        assert_eq!(big.is_error, Some(true));
        assert!(big.structured_content.is_none());
        assert!(report.refused_structured_chars.unwrap() > 500);
    }

    #[test]
    fn text_is_cut_at_the_limit_with_a_marker() {
        let guard = Guardrails::default();
        let mut result = CallToolResult::success(vec![
            ContentBlock::text("é".repeat(60)),
            ContentBlock::text("b".repeat(60)),
            ContentBlock::text("never reached"),
        ]);
        let report = guard.apply(&mut result, 100);
        let texts: Vec<String> = result
            .content
            .iter()
            .map(|c| c.as_text().unwrap().text.clone())
            .collect();
        assert_eq!(texts[0], "é".repeat(60));
        assert!(texts[1].starts_with(&"b".repeat(40)));
        assert!(
            texts[1].contains("[truncated: 20 of 60 characters cut"),
            "{}",
            texts[1]
        );
        assert!(
            texts[2].starts_with("\n[truncated: 13 of 13"),
            "{}",
            texts[2]
        );
        assert_eq!(report.truncated_chars, 33);
        // Under the limit, nothing changes.
        let mut small = CallToolResult::success(vec![ContentBlock::text("short")]);
        assert!(guard.apply(&mut small, 100).is_empty());
        assert_eq!(small.content[0].as_text().unwrap().text, "short");
    }

    #[test]
    fn masking_off_leaves_secrets_to_the_operator() {
        let guard = Guardrails {
            mask_secrets: false,
            max_result_chars: 0,
        };
        let mut result = CallToolResult::success(vec![ContentBlock::text(
            "ghp_0123456789abcdefghijABCDEFGHIJ012345",
        )]);
        assert!(guard.apply(&mut result, 0).is_empty());
        assert!(
            result.content[0]
                .as_text()
                .unwrap()
                .text
                .starts_with("ghp_")
        );
    }
}
