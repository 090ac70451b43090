//! The three audit trails: discovery (what a caller could see), access
//! (authentication outcomes) and activity (one row per tool call).
//!
//! Audit rows must outlive the tokens they name. Each insert resolves its
//! token reference in the same statement: the `token_id` column is set only if
//! the token row still exists at that moment, and the id the caller passed
//! always goes into `details.token_id`. The foreign key is `ON DELETE SET
//! NULL`, so removing a token later nulls the column and keeps the row. On
//! PostgreSQL the statement also takes `FOR KEY SHARE` on the token row, so a
//! concurrent sweep either finishes first (the column is NULL) or waits for
//! the insert to commit (and then nulls it). SQLite runs one writer at a
//! time, and an insert holds the write lock from its first step, so the
//! lookup and the insert see the same state there too.

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use sqlx::{
    Row,
    any::{AnyArguments, AnyRow},
    query::Query,
};
use std::sync::LazyLock;

use crate::{Backend, Result, Store, StoreError, to_i64};

/// One of the three audit trails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuditKind {
    Discovery,
    Access,
    Activity,
}

impl AuditKind {
    /// In declaration order, so `kind as usize` is its index here.
    pub const ALL: [AuditKind; 3] = [AuditKind::Discovery, AuditKind::Access, AuditKind::Activity];

    pub fn as_str(self) -> &'static str {
        match self {
            AuditKind::Discovery => "discovery",
            AuditKind::Access => "access",
            AuditKind::Activity => "activity",
        }
    }

    fn table(self) -> &'static str {
        match self {
            AuditKind::Discovery => "discovery_audit",
            AuditKind::Access => "access_audit",
            AuditKind::Activity => "activity_audit",
        }
    }

    pub(crate) fn select(self) -> &'static str {
        match self {
            AuditKind::Discovery => {
                "SELECT id, created_at, principal, token_id, visible_count, visible_digest, details \
                 FROM discovery_audit"
            }
            AuditKind::Access => {
                "SELECT id, created_at, principal, token_id, outcome, reason, details \
                 FROM access_audit"
            }
            AuditKind::Activity => {
                "SELECT id, created_at, principal, token_id, tool, args_hash, decision, approval_id, \
                 outcome, latency_ms, bytes_in, bytes_out, details FROM activity_audit"
            }
        }
    }
}

impl std::fmt::Display for AuditKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for AuditKind {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<AuditKind> {
        AuditKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                StoreError::invalid(
                    "audit kind",
                    format!("'{s}' (expected discovery, access or activity)"),
                )
            })
    }
}

/// One row for one of the three trails.
#[derive(Debug, Clone)]
pub enum AuditRow {
    Discovery(DiscoveryEvent),
    Access(AccessEvent),
    Activity(ActivityEvent),
}

impl AuditRow {
    /// The trail this row goes to.
    pub fn kind(&self) -> AuditKind {
        match self {
            AuditRow::Discovery(_) => AuditKind::Discovery,
            AuditRow::Access(_) => AuditKind::Access,
            AuditRow::Activity(_) => AuditKind::Activity,
        }
    }
}

/// What a caller was shown by a listing or search. Holds a digest of the
/// visible names, never the names: [`DiscoveryEvent::new`] drops them.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscoveryEvent {
    pub at: i64,
    pub principal: String,
    pub token_id: Option<String>,
    pub visible_count: u64,
    pub visible_digest: String,
    /// A JSON object; `token_id` is added to it.
    pub details: Value,
}

impl DiscoveryEvent {
    pub fn new<S: AsRef<str>>(
        at: i64,
        principal: impl Into<String>,
        token_id: Option<&str>,
        visible_names: &[S],
    ) -> DiscoveryEvent {
        DiscoveryEvent {
            at,
            principal: principal.into(),
            token_id: token_id.map(str::to_string),
            visible_count: visible_names.len() as u64,
            visible_digest: visible_tools_digest(visible_names),
            details: json!({}),
        }
    }

    pub fn details(mut self, details: Value) -> DiscoveryEvent {
        self.details = details;
        self
    }
}

/// SHA-256 (hex) of the visible names, sorted and deduplicated, each followed
/// by a newline. Independent of the order the names came in.
pub fn visible_tools_digest<S: AsRef<str>>(names: &[S]) -> String {
    let mut sorted: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let mut hasher = Sha256::new();
    for name in sorted {
        hasher.update(name.as_bytes());
        hasher.update(b"\n");
    }
    hex::encode(hasher.finalize())
}

/// SHA-256 (hex) of a JSON value in canonical form (object keys sorted at
/// every level, no whitespace), so the same arguments hash the same whatever
/// order their keys came in. Approvals are bound to this hash.
pub fn hash_arguments(arguments: &Value) -> String {
    let mut text = Vec::with_capacity(128);
    canonical(arguments, &mut text);
    hex::encode(Sha256::digest(&text))
}

/// [`hash_arguments`] of an object, without first making it a `Value`.
pub fn hash_argument_object(arguments: &serde_json::Map<String, Value>) -> String {
    let mut text = Vec::with_capacity(128);
    canonical_object(arguments, &mut text);
    hex::encode(Sha256::digest(&text))
}

fn canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => canonical_object(map, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(item, out);
            }
            out.push(b']');
        }
        // Writing to a Vec cannot fail.
        scalar => serde_json::to_writer(&mut *out, scalar).expect("JSON into memory"),
    }
}

fn canonical_object(map: &serde_json::Map<String, Value>, out: &mut Vec<u8>) {
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    out.push(b'{');
    for (i, (key, value)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, key).expect("JSON into memory");
        out.push(b':');
        canonical(value, out);
    }
    out.push(b'}');
}

/// The most bytes of a caller-chosen name (an unknown tool's) that an
/// audit row keeps or an answer repeats; a longer one is cut, and the
/// row keeps its SHA-256.
pub const MAX_STORED_NAME_BYTES: usize = 256;
/// The most bytes of caller-chosen text an access failure keeps (a claimed
/// token id, a refused access token's reason).
pub const MAX_ACCESS_TEXT_BYTES: usize = 64;

/// `text` cut to at most `max` bytes, at a character boundary.
pub fn cut_text(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The SHA-256 of `text`, in hex.
pub fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessOutcome {
    Success,
    Failure,
}

impl AccessOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            AccessOutcome::Success => "success",
            AccessOutcome::Failure => "failure",
        }
    }
}

/// An authentication attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct AccessEvent {
    pub at: i64,
    pub principal: Option<String>,
    /// The id the bearer claimed, if it had a readable one.
    pub token_id: Option<String>,
    pub outcome: AccessOutcome,
    /// Why it failed (e.g. [`crate::AuthError::reason`]).
    pub reason: Option<String>,
    pub details: Value,
}

impl AccessEvent {
    pub fn success(at: i64, principal: impl Into<String>, token_id: Option<&str>) -> AccessEvent {
        AccessEvent {
            at,
            principal: Some(principal.into()),
            token_id: token_id.map(str::to_string),
            outcome: AccessOutcome::Success,
            reason: None,
            details: json!({}),
        }
    }

    /// A failed attempt. The claimed id and the reason may hold what the
    /// caller chose, so each is cut at [`MAX_ACCESS_TEXT_BYTES`].
    pub fn failure(at: i64, token_id: Option<&str>, reason: impl Into<String>) -> AccessEvent {
        let mut reason = reason.into();
        reason.truncate(cut_text(&reason, MAX_ACCESS_TEXT_BYTES).len());
        AccessEvent {
            at,
            principal: None,
            token_id: token_id.map(|id| cut_text(id, MAX_ACCESS_TEXT_BYTES).to_string()),
            outcome: AccessOutcome::Failure,
            reason: Some(reason),
            details: json!({}),
        }
    }

    pub fn details(mut self, details: Value) -> AccessEvent {
        self.details = details;
        self
    }
}

/// What governance decided about a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A policy (or the default) allowed it.
    Allowed,
    /// A policy denied it.
    Denied,
    /// It needs an approval; none was presented, so one was requested.
    ApprovalRequired,
    /// It needed an approval and a matching one was consumed.
    Approved,
    /// A rate limit refused it.
    RateLimited,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Denied => "denied",
            Decision::ApprovalRequired => "approval_required",
            Decision::Approved => "approved",
            Decision::RateLimited => "rate_limited",
        }
    }
}

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// The upstream answered without error.
    Success,
    /// The upstream answered with an error, failed or timed out.
    Error,
    /// Governance stopped it before it reached the upstream.
    NotForwarded,
}

impl CallOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            CallOutcome::Success => "success",
            CallOutcome::Error => "error",
            CallOutcome::NotForwarded => "not_forwarded",
        }
    }
}

/// One tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct ActivityEvent {
    pub at: i64,
    pub principal: String,
    pub token_id: Option<String>,
    /// The qualified tool name.
    pub tool: String,
    /// [`hash_arguments`] of the arguments; the arguments themselves are not kept.
    pub args_hash: String,
    pub decision: Decision,
    pub approval_id: Option<String>,
    pub outcome: CallOutcome,
    pub latency_ms: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub details: Value,
}

/// `details` as an object with the caller's token id in it.
fn details_with_token(details: &Value, token_id: Option<&str>) -> String {
    let mut map = match details {
        Value::Object(map) => map.clone(),
        Value::Null => Map::new(),
        other => {
            let mut map = Map::new();
            map.insert("value".to_string(), other.clone());
            map
        }
    };
    if let Some(id) = token_id {
        map.insert("token_id".to_string(), Value::String(id.to_string()));
    }
    Value::Object(map).to_string()
}

/// The INSERT of one audit row (no `RETURNING`), with its parameters in
/// [`bind_row`]'s order. The token id comes first and resolves to NULL for
/// a token that is gone. On SQLite the parameters are anonymous (`?`), so
/// that several rows can share one statement list: sqlx binds them in
/// order across its statements. Built once per backend and kind: every
/// call writes one.
pub(crate) fn insert_sql(backend: Backend, row: &AuditRow) -> &'static str {
    insert_sql_for(backend, row.kind())
}

pub(crate) fn insert_sql_for(backend: Backend, kind: AuditKind) -> &'static str {
    static SQL: LazyLock<[[String; 3]; 2]> = LazyLock::new(|| {
        [Backend::Sqlite, Backend::Postgres]
            .map(|backend| AuditKind::ALL.map(|kind| build_insert(backend, kind)))
    });
    let backend = match backend {
        Backend::Sqlite => 0,
        Backend::Postgres => 1,
    };
    // `AuditKind::ALL` lists the kinds in declaration order.
    &SQL[backend][kind as usize]
}

/// The columns an insert of `kind` names after `token_id`, in order.
pub(crate) fn insert_columns(kind: AuditKind) -> &'static str {
    match kind {
        AuditKind::Discovery => "created_at, principal, visible_count, visible_digest, details",
        AuditKind::Access => "created_at, principal, outcome, reason, details",
        AuditKind::Activity => {
            "created_at, principal, tool, args_hash, decision, approval_id, outcome, \
             latency_ms, bytes_in, bytes_out, details"
        }
    }
}

fn build_insert(backend: Backend, kind: AuditKind) -> String {
    let columns = insert_columns(kind);
    let (table, values) = (kind.table(), columns.split(',').count());
    match backend {
        Backend::Sqlite => format!(
            "INSERT INTO {table} (token_id, {columns}) \
             VALUES ((SELECT id FROM tokens WHERE id = ?){})",
            ", ?".repeat(values)
        ),
        Backend::Postgres => {
            let rest: String = (2..=values + 1).map(|n| format!(", ${n}")).collect();
            format!(
                "WITH live_token AS (SELECT id FROM tokens WHERE id = $1 FOR KEY SHARE) \
                 INSERT INTO {table} (token_id, {columns}) \
                 VALUES ((SELECT id FROM live_token){rest})"
            )
        }
    }
}

/// One value of an audit insert.
pub(crate) enum Cell<'a> {
    Text(Option<&'a str>),
    Owned(String),
    Int(i64),
}

/// `row`'s values in [`insert_sql`]'s order, the token id first: the one
/// place that order is written, for sqlx and for the inline SQLite writer.
pub(crate) fn row_cells(row: &AuditRow) -> Result<Vec<Cell<'_>>> {
    use Cell::{Int, Owned, Text};
    let details = |details: &Value, token: Option<&str>| Owned(details_with_token(details, token));
    Ok(match row {
        AuditRow::Discovery(event) => vec![
            Text(event.token_id.as_deref()),
            Int(event.at),
            Text(Some(&event.principal)),
            Int(to_i64("visible count", event.visible_count)?),
            Text(Some(&event.visible_digest)),
            details(&event.details, event.token_id.as_deref()),
        ],
        AuditRow::Access(event) => vec![
            Text(event.token_id.as_deref()),
            Int(event.at),
            Text(event.principal.as_deref()),
            Text(Some(event.outcome.as_str())),
            Text(event.reason.as_deref()),
            details(&event.details, event.token_id.as_deref()),
        ],
        AuditRow::Activity(event) => vec![
            Text(event.token_id.as_deref()),
            Int(event.at),
            Text(Some(&event.principal)),
            Text(Some(&event.tool)),
            Text(Some(&event.args_hash)),
            Text(Some(event.decision.as_str())),
            Text(event.approval_id.as_deref()),
            Text(Some(event.outcome.as_str())),
            Int(to_i64("latency", event.latency_ms)?),
            Int(to_i64("bytes in", event.bytes_in)?),
            Int(to_i64("bytes out", event.bytes_out)?),
            details(&event.details, event.token_id.as_deref()),
        ],
    })
}

/// Binds `row`'s values in [`insert_sql`]'s order.
pub(crate) fn bind_row<'q>(
    mut query: Query<'q, sqlx::Any, AnyArguments<'q>>,
    row: &'q AuditRow,
) -> Result<Query<'q, sqlx::Any, AnyArguments<'q>>> {
    for cell in row_cells(row)? {
        query = match cell {
            Cell::Text(text) => query.bind(text),
            Cell::Owned(text) => query.bind(text),
            Cell::Int(n) => query.bind(n),
        };
    }
    Ok(query)
}

impl Store {
    /// Deletes the rows of one audit trail written before `before` (ms),
    /// oldest first, in passes of at most [`crate::SWEEP_BATCH`] rows (each
    /// its own short statement on the `created_at` index). Returns how many
    /// rows went.
    pub async fn sweep_audit(&self, kind: AuditKind, before: i64) -> Result<u64> {
        let table = kind.table();
        let sql = format!(
            "DELETE FROM {table} WHERE id IN (\
               SELECT id FROM {table} WHERE created_at < $1 \
               ORDER BY created_at LIMIT $2)"
        );
        let mut total = 0;
        loop {
            let done = self
                .query(&sql)
                .bind(before)
                .bind(crate::SWEEP_BATCH as i64)
                .execute(self.pool())
                .await?;
            total += done.rows_affected();
            if done.rows_affected() < crate::SWEEP_BATCH as u64 {
                return Ok(total);
            }
        }
    }
}

pub(crate) fn audit_json(kind: AuditKind, row: &AnyRow) -> Result<Value> {
    let details_text: String = row.try_get("details")?;
    let details: Value = serde_json::from_str(&details_text)
        .map_err(|_| StoreError::corrupt("audit details", details_text.clone()))?;
    let mut out = Map::new();
    out.insert("kind".into(), kind.as_str().into());
    out.insert("id".into(), row.try_get::<i64, _>("id")?.into());
    out.insert(
        "created_at".into(),
        row.try_get::<i64, _>("created_at")?.into(),
    );
    out.insert(
        "principal".into(),
        row.try_get::<Option<String>, _>("principal")?.into(),
    );
    out.insert(
        "token_id".into(),
        row.try_get::<Option<String>, _>("token_id")?.into(),
    );
    match kind {
        AuditKind::Discovery => {
            out.insert(
                "visible_count".into(),
                row.try_get::<i64, _>("visible_count")?.into(),
            );
            out.insert(
                "visible_digest".into(),
                row.try_get::<String, _>("visible_digest")?.into(),
            );
        }
        AuditKind::Access => {
            out.insert(
                "outcome".into(),
                row.try_get::<String, _>("outcome")?.into(),
            );
            out.insert(
                "reason".into(),
                row.try_get::<Option<String>, _>("reason")?.into(),
            );
        }
        AuditKind::Activity => {
            for column in ["tool", "args_hash", "decision", "outcome"] {
                out.insert(column.into(), row.try_get::<String, _>(column)?.into());
            }
            out.insert(
                "approval_id".into(),
                row.try_get::<Option<String>, _>("approval_id")?.into(),
            );
            for column in ["latency_ms", "bytes_in", "bytes_out"] {
                out.insert(column.into(), row.try_get::<i64, _>(column)?.into());
            }
        }
    }
    out.insert("details".into(), details);
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_ignores_order_and_duplicates() {
        let a = visible_tools_digest(&["b__y", "a__x"]);
        let b = visible_tools_digest(&["a__x", "b__y", "a__x"]);
        assert_eq!(a, b);
        assert_eq!(a.len(), 64);
        assert_ne!(a, visible_tools_digest(&["a__x"]));
        // No separator ambiguity: ["ab"] is not ["a", "b"].
        assert_ne!(
            visible_tools_digest(&["ab"]),
            visible_tools_digest(&["a", "b"])
        );
    }

    #[test]
    fn each_kind_sits_at_its_own_index_in_all() {
        for (index, kind) in AuditKind::ALL.into_iter().enumerate() {
            assert_eq!(kind as usize, index, "{kind}");
            assert!(build_insert(Backend::Sqlite, kind).contains(kind.table()));
        }
    }

    #[test]
    fn argument_hash_is_canonical() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"y":[1,2],"x":"s"}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":"s","y":[1,2]},"b":1}"#).unwrap();
        assert_eq!(hash_arguments(&a), hash_arguments(&b));
        let c: Value = serde_json::from_str(r#"{"a":{"x":"s","y":[2,1]},"b":1}"#).unwrap();
        assert_ne!(hash_arguments(&a), hash_arguments(&c));
    }

    #[test]
    fn argument_hash_is_sha256_of_the_canonical_text_both_ways() {
        // Approvals already granted are bound to this exact text.
        let value: Value =
            serde_json::from_str(r#"{"b":[1,"x\"y",null],"a":{"d":true,"c":1.5}}"#).unwrap();
        let expected = "7ad39498f5afd30b7c41808fe2ee8bad9dd6cf36479632fc958305c3cfdf95b8";
        assert_eq!(hash_arguments(&value), expected);
        assert_eq!(hash_argument_object(value.as_object().unwrap()), expected);
    }

    #[test]
    fn text_is_cut_at_a_character_boundary() {
        assert_eq!(cut_text("abc", 3), "abc");
        assert_eq!(cut_text("abcd", 3), "abc");
        assert_eq!(cut_text("aé", 2), "a");
        let event = AccessEvent::failure(0, Some(&"i".repeat(100)), "r".repeat(100));
        assert_eq!(event.token_id.unwrap().len(), MAX_ACCESS_TEXT_BYTES);
        assert_eq!(event.reason.unwrap().len(), MAX_ACCESS_TEXT_BYTES);
    }

    #[test]
    fn details_carry_the_token_id() {
        let text = details_with_token(&json!({"k": 1}), Some("abc"));
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value, json!({"k": 1, "token_id": "abc"}));
        assert_eq!(details_with_token(&Value::Null, None), "{}");
        assert_eq!(details_with_token(&json!(3), None), r#"{"value":3}"#);
    }
}
