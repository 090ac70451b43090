//! Tool classifications and quarantine.
//!
//! One row per `(server, tool)`: the hash of the definition as last seen, the
//! risk tier an operator set (or none), whether the tool is approved or
//! quarantined, and the hash of the definition the operator approved. A
//! definition that changes away from the approved one puts the tool back in
//! quarantine until an operator approves the new definition; changing back to
//! the approved definition lifts it again.

use std::{fmt, str::FromStr};

use serde::Serialize;
use sqlx::{Row, any::AnyRow};

use crate::{Result, Store, StoreError, now_ms};

/// How much harm a tool can do. Set by an operator; upstream annotations are
/// hints and never decide it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RiskTier {
    ReadOnly,
    Write,
    Destructive,
}

impl RiskTier {
    pub const ALL: [RiskTier; 3] = [RiskTier::ReadOnly, RiskTier::Write, RiskTier::Destructive];

    pub fn as_str(self) -> &'static str {
        match self {
            RiskTier::ReadOnly => "read_only",
            RiskTier::Write => "write",
            RiskTier::Destructive => "destructive",
        }
    }
}

impl fmt::Display for RiskTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RiskTier {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<RiskTier> {
        RiskTier::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| {
                StoreError::invalid(
                    "risk tier",
                    format!("'{s}' (expected read_only, write or destructive)"),
                )
            })
    }
}

/// The status a tool gets when it is first recorded: `on_known_server` when
/// other tools of its server were recorded before (a tool that appears
/// later, perhaps one that vanished and came back renamed), else
/// `on_new_server` (a server's first import).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewToolStatus {
    pub on_new_server: ToolStatus,
    pub on_known_server: ToolStatus,
}

impl From<ToolStatus> for NewToolStatus {
    fn from(status: ToolStatus) -> Self {
        NewToolStatus {
            on_new_server: status,
            on_known_server: status,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolStatus {
    Approved,
    Quarantined,
}

impl ToolStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolStatus::Approved => "approved",
            ToolStatus::Quarantined => "quarantined",
        }
    }

    fn parse(s: &str) -> Result<ToolStatus> {
        match s {
            "approved" => Ok(ToolStatus::Approved),
            "quarantined" => Ok(ToolStatus::Quarantined),
            other => Err(StoreError::corrupt("tool status", other)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolClassification {
    pub server: String,
    pub tool: String,
    /// The definition as last seen.
    pub definition_hash: String,
    /// Set by an operator; `None` until then.
    pub tier: Option<RiskTier>,
    pub status: ToolStatus,
    /// The definition an operator approved, if any.
    pub approved_hash: Option<String>,
    pub first_seen_at: i64,
    pub updated_at: i64,
}

impl ToolClassification {
    /// Approved, and still the definition that was approved.
    pub fn is_callable(&self) -> bool {
        self.status == ToolStatus::Approved
            && self.approved_hash.as_deref() == Some(self.definition_hash.as_str())
    }

    fn from_row(row: &AnyRow) -> Result<ToolClassification> {
        let tier: Option<String> = row.try_get("tier")?;
        let status: String = row.try_get("status")?;
        Ok(ToolClassification {
            server: row.try_get("server")?,
            tool: row.try_get("tool")?,
            definition_hash: row.try_get("definition_hash")?,
            tier: tier
                .map(|t| t.parse().map_err(|_| StoreError::corrupt("tool tier", t)))
                .transpose()?,
            status: ToolStatus::parse(&status)?,
            approved_hash: row.try_get("approved_hash")?,
            first_seen_at: row.try_get("first_seen_at")?,
            updated_at: row.try_get("updated_at")?,
        })
    }
}

/// What [`Store::observe_tool`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolObservation {
    /// First sighting; recorded with the status asked for.
    New(ToolClassification),
    /// Same definition as last time.
    Unchanged(ToolClassification),
    /// The definition changed. `current.status` says whether the tool is now
    /// quarantined (it is, unless the new definition is the approved one).
    Changed {
        previous_hash: String,
        current: ToolClassification,
    },
}

impl ToolObservation {
    pub fn classification(&self) -> &ToolClassification {
        match self {
            ToolObservation::New(c) | ToolObservation::Unchanged(c) => c,
            ToolObservation::Changed { current, .. } => current,
        }
    }
}

/// A read-only comparison of a definition hash with the stored one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashCheck {
    /// The tool was never recorded.
    Unknown,
    /// Same as last seen.
    Same,
    /// Differs from what was last seen.
    Changed {
        stored_hash: String,
        approved_hash: Option<String>,
    },
}

const TOOL_COLUMNS: &str =
    "server, tool, definition_hash, tier, status, approved_hash, first_seen_at, updated_at";

impl Store {
    /// Whether any tool of `server` has been recorded.
    pub async fn server_observed(&self, server: &str) -> Result<bool> {
        let row = self
            .query("SELECT 1 AS one FROM tool_classifications WHERE server = $1 LIMIT 1")
            .bind(server)
            .fetch_optional(self.pool())
            .await?;
        Ok(row.is_some())
    }

    /// Records that `server` lists `tool` with a definition hashing to
    /// `definition_hash`. A new tool gets `status_if_new` (`Approved` also
    /// approves this definition). A changed definition is stored and the tool
    /// is quarantined unless the new definition is the approved one.
    pub async fn observe_tool(
        &self,
        server: &str,
        tool: &str,
        definition_hash: &str,
        status_if_new: impl Into<NewToolStatus>,
        now: i64,
    ) -> Result<ToolObservation> {
        let status_if_new = status_if_new.into();
        // Optimistic: read, then write conditioned on what was read; retry if
        // another process got there in between.
        for _ in 0..8 {
            match self.tool_classification(server, tool).await? {
                None => {
                    let status_if_new = if status_if_new.on_new_server
                        == status_if_new.on_known_server
                        || !self.server_observed(server).await?
                    {
                        status_if_new.on_new_server
                    } else {
                        status_if_new.on_known_server
                    };
                    let approved_hash =
                        (status_if_new == ToolStatus::Approved).then_some(definition_hash);
                    let sql = format!(
                        "INSERT INTO tool_classifications ({TOOL_COLUMNS}) \
                         VALUES ($1, $2, $3, NULL, $4, $5, $6, $6) \
                         ON CONFLICT (server, tool) DO NOTHING RETURNING {TOOL_COLUMNS}"
                    );
                    let row = self
                        .query(&sql)
                        .bind(server)
                        .bind(tool)
                        .bind(definition_hash)
                        .bind(status_if_new.as_str())
                        .bind(approved_hash)
                        .bind(now)
                        .fetch_optional(self.pool())
                        .await?;
                    self.governance_written();
                    if let Some(row) = row {
                        return Ok(ToolObservation::New(ToolClassification::from_row(&row)?));
                    }
                }
                Some(known) if known.definition_hash == definition_hash => {
                    return Ok(ToolObservation::Unchanged(known));
                }
                Some(known) => {
                    let sql = format!(
                        "UPDATE tool_classifications SET definition_hash = $3, updated_at = $5, \
                           status = CASE WHEN approved_hash = $3 THEN 'approved' ELSE 'quarantined' END \
                         WHERE server = $1 AND tool = $2 AND definition_hash = $4 \
                         RETURNING {TOOL_COLUMNS}"
                    );
                    let row = self
                        .query(&sql)
                        .bind(server)
                        .bind(tool)
                        .bind(definition_hash)
                        .bind(&known.definition_hash)
                        .bind(now)
                        .fetch_optional(self.pool())
                        .await?;
                    self.governance_written();
                    if let Some(row) = row {
                        return Ok(ToolObservation::Changed {
                            previous_hash: known.definition_hash,
                            current: ToolClassification::from_row(&row)?,
                        });
                    }
                }
            }
        }
        Err(StoreError::Conflict(format!(
            "tool {server}/{tool} kept changing while being recorded"
        )))
    }

    /// Compares a definition hash with the stored one without writing.
    pub async fn detect_hash_change(
        &self,
        server: &str,
        tool: &str,
        definition_hash: &str,
    ) -> Result<HashCheck> {
        Ok(match self.tool_classification(server, tool).await? {
            None => HashCheck::Unknown,
            Some(known) if known.definition_hash == definition_hash => HashCheck::Same,
            Some(known) => HashCheck::Changed {
                stored_hash: known.definition_hash,
                approved_hash: known.approved_hash,
            },
        })
    }

    pub async fn tool_classification(
        &self,
        server: &str,
        tool: &str,
    ) -> Result<Option<ToolClassification>> {
        let sql = format!(
            "SELECT {TOOL_COLUMNS} FROM tool_classifications WHERE server = $1 AND tool = $2"
        );
        let row = self
            .query(&sql)
            .bind(server)
            .bind(tool)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(ToolClassification::from_row).transpose()
    }

    /// Every recorded tool, by server then tool. One statement.
    pub async fn list_tool_classifications(&self) -> Result<Vec<ToolClassification>> {
        let sql = format!("SELECT {TOOL_COLUMNS} FROM tool_classifications ORDER BY server, tool");
        let rows = self.query(&sql).fetch_all(self.pool()).await?;
        rows.iter().map(ToolClassification::from_row).collect()
    }

    /// Sets (or with `None` clears) the operator's risk tier for a tool.
    pub async fn classify_tool(
        &self,
        server: &str,
        tool: &str,
        tier: Option<RiskTier>,
    ) -> Result<ToolClassification> {
        let sql = format!(
            "UPDATE tool_classifications SET tier = $3, updated_at = $4 \
             WHERE server = $1 AND tool = $2 RETURNING {TOOL_COLUMNS}"
        );
        let row = self
            .query(&sql)
            .bind(server)
            .bind(tool)
            .bind(tier.map(RiskTier::as_str))
            .bind(now_ms())
            .fetch_optional(self.pool())
            .await?;
        self.governance_written();
        match row {
            Some(row) => ToolClassification::from_row(&row),
            None => Err(not_found(server, tool)),
        }
    }

    /// Approves the definition the operator reviewed. Fails with
    /// [`StoreError::Conflict`] if the stored definition is no longer the one
    /// that hashes to `reviewed_hash`, so a change that lands during review
    /// is never approved unseen.
    pub async fn approve_tool(
        &self,
        server: &str,
        tool: &str,
        reviewed_hash: &str,
    ) -> Result<ToolClassification> {
        let sql = format!(
            "UPDATE tool_classifications SET status = 'approved', approved_hash = definition_hash, \
             updated_at = $4 WHERE server = $1 AND tool = $2 AND definition_hash = $3 \
             RETURNING {TOOL_COLUMNS}"
        );
        let row = self
            .query(&sql)
            .bind(server)
            .bind(tool)
            .bind(reviewed_hash)
            .bind(now_ms())
            .fetch_optional(self.pool())
            .await?;
        self.governance_written();
        match row {
            Some(row) => ToolClassification::from_row(&row),
            None => match self.tool_classification(server, tool).await? {
                None => Err(not_found(server, tool)),
                Some(known) => Err(StoreError::Conflict(format!(
                    "tool {server}/{tool} is now at definition {}, not the reviewed {reviewed_hash}",
                    known.definition_hash
                ))),
            },
        }
    }

    /// Puts a tool in quarantine and withdraws its approval, so only a new
    /// [`Store::approve_tool`] lifts it (a later definition change back to
    /// the old approved one does not).
    pub async fn quarantine_tool(&self, server: &str, tool: &str) -> Result<ToolClassification> {
        let sql = format!(
            "UPDATE tool_classifications SET status = 'quarantined', approved_hash = NULL, \
             updated_at = $3 \
             WHERE server = $1 AND tool = $2 RETURNING {TOOL_COLUMNS}"
        );
        let row = self
            .query(&sql)
            .bind(server)
            .bind(tool)
            .bind(now_ms())
            .fetch_optional(self.pool())
            .await?;
        self.governance_written();
        match row {
            Some(row) => ToolClassification::from_row(&row),
            None => Err(not_found(server, tool)),
        }
    }
}

fn not_found(server: &str, tool: &str) -> StoreError {
    StoreError::NotFound {
        what: "tool",
        id: format!("{server}/{tool}"),
    }
}
