//! The governance admin CLI, end to end: the real `manifold` binary against a
//! real SQLite store in a temp dir. Seeding goes through `manifold_store`
//! opened on the same file, as the gateway would write it.

use std::{
    path::PathBuf,
    process::{Command, Output},
};

use crate::common::line_value;
use manifold_store::{
    AccessEvent, ActivityEvent, AuditCommit, AuditRow, AuditWriter, CallOutcome, Decision,
    DiscoveryEvent, Store, ToolStatus, now_ms, sqlite_url,
};
use serde_json::{Value, json};

struct Env {
    _dir: tempfile::TempDir,
    config: PathBuf,
    db: PathBuf,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("manifold.toml");
        std::fs::write(&config, "[gateway]\n\n[store]\ndata_dir = \"data\"\n").unwrap();
        let db = dir.path().join("data").join("manifold.db");
        Env {
            _dir: dir,
            config,
            db,
        }
    }

    /// Runs `manifold ARGS... --config F`.
    fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_manifold"))
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .env_remove("MANIFOLD_DATABASE_URL")
            .env("MANIFOLD_LOG", "warn")
            .output()
            .unwrap()
    }

    /// Stdout of a command that must succeed.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        let stdout = String::from_utf8(out.stdout).unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(
            out.status.success(),
            "{args:?} failed: {stderr}\nstdout: {stdout}"
        );
        stdout
    }

    /// Stderr of a command that must fail.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(
            !out.status.success(),
            "{args:?} succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        stderr
    }

    async fn store(&self) -> Store {
        std::fs::create_dir_all(self.db.parent().unwrap()).unwrap();
        Store::connect(&sqlite_url(&self.db)).await.unwrap()
    }
}

/// The table row whose first cell is `id`.
fn row<'a>(table: &'a str, id: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(id))
        .unwrap_or_else(|| panic!("no row {id} in:\n{table}"))
}

#[test]
fn tokens_create_list_revoke_and_groups() {
    let env = Env::new();
    let created = env.ok(&[
        "token",
        "create",
        "--name",
        "ci bot",
        "--action",
        "discover",
        "--scope",
        "gh__*",
        "--group",
        "ops",
        "--expires",
        "12h",
    ]);
    let secret = line_value(&created, "token:");
    assert!(secret.starts_with("mfd_"), "{created}");
    assert_eq!(created.matches("mfd_").count(), 1, "shown once: {created}");
    assert!(created.contains("will not be shown again"), "{created}");
    let id = line_value(&created, "id:").to_string();
    assert!(secret.starts_with(&format!("mfd_{id}_")));
    let expires = line_value(&created, "expires:");
    assert!(expires.ends_with('Z') && expires.contains('T'), "{expires}");

    let never = env.ok(&["token", "create", "--name", "forever", "--expires", "never"]);
    assert_eq!(line_value(&never, "expires:"), "never");
    let never_id = line_value(&never, "id:").to_string();

    let list = env.ok(&["token", "list"]);
    assert!(!list.contains("mfd_"), "no secrets in the list: {list}");
    let cells: Vec<&str> = row(&list, &id).split_whitespace().collect();
    // id, name (two words), actions, scopes, groups, expires, state
    assert_eq!(
        cells,
        vec![
            &id, "ci", "bot", "discover", "gh__*", "ops", expires, "active"
        ]
    );
    let forever = row(&list, &never_id);
    assert!(forever.contains("discover,call,code"), "{forever}");
    assert!(forever.contains(" never "), "{forever}");
    assert!(forever.ends_with("active"), "{forever}");

    assert!(env.ok(&["token", "revoke", &id]).contains(&id));
    assert!(row(&env.ok(&["token", "list"]), &id).ends_with("revoked"));
    let err = env.fails(&["token", "revoke", "000000000000"]);
    assert!(err.contains("no token with id '000000000000'"), "{err}");
    assert_eq!(
        env.run(&["token", "revoke", "000000000000"]).status.code(),
        Some(1)
    );

    env.ok(&["token", "group", "add", &never_id, "eng"]);
    env.ok(&["token", "group", "add", &never_id, "admins"]);
    env.ok(&["token", "group", "remove", &never_id, "eng"]);
    let json: Value = serde_json::from_str(&env.ok(&["token", "list", "--json"])).unwrap();
    let forever = json
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == never_id.as_str())
        .unwrap();
    assert_eq!(forever["groups"], json!(["admins"]));
    assert_eq!(forever["expires_at"], Value::Null);
    assert!(forever.get("token").is_none());
    let err = env.fails(&["token", "group", "remove", &never_id, "eng"]);
    assert!(err.contains("not in group"), "{err}");
    let err = env.fails(&["token", "group", "add", "000000000000", "eng"]);
    assert!(err.contains("not found"), "{err}");

    let as_json: Value = serde_json::from_str(&env.ok(&[
        "token",
        "create",
        "--name",
        "j",
        "--expires",
        "30d",
        "--json",
    ]))
    .unwrap();
    assert!(as_json["token"].as_str().unwrap().starts_with("mfd_"));
    assert_eq!(as_json["state"], "active");
    let lifetime =
        as_json["expires_at"].as_i64().unwrap() - as_json["created_at"].as_i64().unwrap();
    assert_eq!(lifetime, 30 * 86_400_000);

    let err = env.fails(&["token", "create", "--name", "x", "--action", "root"]);
    assert!(err.contains("discover, call, code or admin"), "{err}");
    let err = env.fails(&["token", "create", "--name", "x", "--expires", "soon"]);
    assert!(err.contains("--expires") && err.contains("30d"), "{err}");
    // A bad group leaves no token behind.
    let before = env.ok(&["token", "list"]).lines().count();
    env.fails(&["token", "create", "--name", "x", "--group", "two words"]);
    assert_eq!(env.ok(&["token", "list"]).lines().count(), before);
}

#[test]
fn policies_add_list_update_remove() {
    let env = Env::new();
    let id = env
        .ok(&[
            "policy",
            "add",
            "--effect",
            "deny",
            "--server",
            "gh",
            "--tool",
            "delete_*",
            "--tier",
            "destructive",
            "--principal",
            "group:interns",
            "--description",
            "no deletes",
        ])
        .trim()
        .to_string();
    assert!(id.starts_with("pol_"), "{id}");
    let list = env.ok(&["policy", "list"]);
    let r = row(&list, &id);
    for cell in [
        "group:interns",
        "gh",
        "delete_*",
        "destructive",
        "deny",
        "no deletes",
    ] {
        assert!(r.contains(cell), "{cell} in {r}");
    }

    let err = env.fails(&["policy", "add", "--effect", "rate_limit", "--limit", "5"]);
    assert!(err.contains("--limit") && err.contains("--window"), "{err}");
    let err = env.fails(&["policy", "add", "--effect", "allow", "--limit", "5"]);
    assert!(err.contains("only to --effect rate_limit"), "{err}");
    let err = env.fails(&["policy", "add", "--effect", "maybe"]);
    for valid in ["allow", "deny", "require_approval", "rate_limit"] {
        assert!(err.contains(valid), "{valid} listed in {err}");
    }
    let err = env.fails(&["policy", "add", "--effect", "allow", "--principal", "bob"]);
    assert!(err.contains("token:<id>"), "{err}");

    let updated = env.ok(&[
        "policy",
        "update",
        &id,
        "--effect",
        "rate_limit",
        "--limit",
        "10",
        "--window",
        "5m",
        "--principal",
        "token:abc",
    ]);
    assert!(updated.contains(&id), "{updated}");
    let json: Value = serde_json::from_str(&env.ok(&["policy", "list", "--json"])).unwrap();
    let p = &json[0];
    assert_eq!(p["id"], id.as_str());
    assert_eq!(p["effect"], "rate_limit");
    assert_eq!(p["limit"], 10);
    assert_eq!(p["window_seconds"], 300);
    assert_eq!(p["principal"], "token:abc");
    // Update replaces the rule: omitted flags take add's defaults.
    assert_eq!(p["server"], "*");
    assert_eq!(p["tier"], "any");
    assert!(row(&env.ok(&["policy", "list"]), &id).contains("rate_limit 10/300s"));

    let err = env.fails(&["policy", "update", "pol_nope", "--effect", "allow"]);
    assert!(
        err.contains("pol_nope") && err.contains("not found"),
        "{err}"
    );

    assert!(env.ok(&["policy", "remove", &id]).contains(&id));
    assert!(!env.ok(&["policy", "list"]).contains(&id));
    let err = env.fails(&["policy", "remove", &id]);
    assert!(err.contains("no policy"), "{err}");
}

#[tokio::test]
async fn tools_classify_approve_quarantine() {
    let env = Env::new();
    let store = env.store().await;
    let hash = "a".repeat(64);
    store
        .observe_tool(
            "gh",
            "delete_repo",
            &hash,
            ToolStatus::Quarantined,
            now_ms(),
        )
        .await
        .unwrap();
    store
        .observe_tool(
            "gh",
            "list_repos",
            &"b".repeat(64),
            ToolStatus::Approved,
            now_ms(),
        )
        .await
        .unwrap();

    let list = env.ok(&["tools", "list"]);
    let r = row(&list, "gh");
    assert!(list.contains("delete_repo"), "{list}");
    assert!(
        r.contains("quarantined") && r.contains("aaaaaaaaaaaa"),
        "{list}"
    );
    let q = env.ok(&["tools", "list", "--quarantined"]);
    assert!(
        q.contains("delete_repo") && !q.contains("list_repos"),
        "{q}"
    );

    let out = env.ok(&[
        "tools",
        "classify",
        "gh",
        "delete_repo",
        "--tier",
        "destructive",
    ]);
    assert!(out.contains("destructive"), "{out}");
    let out = env.ok(&["tools", "approve", "gh", "delete_repo"]);
    assert!(out.contains("approved"), "{out}");
    let json: Value = serde_json::from_str(&env.ok(&["tools", "list", "--json"])).unwrap();
    assert_eq!(json[0]["tool"], "delete_repo");
    assert_eq!(json[0]["status"], "approved");
    assert_eq!(json[0]["tier"], "destructive");
    assert_eq!(json[0]["approved_hash"], hash.as_str());
    assert!(env.ok(&["tools", "list", "--quarantined"]).lines().count() == 1);

    env.ok(&["tools", "quarantine", "gh", "delete_repo"]);
    let c = store
        .tool_classification("gh", "delete_repo")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.status, ToolStatus::Quarantined);
    assert_eq!(c.approved_hash, None);

    // A stale reviewed hash is refused; the shown prefix is accepted.
    let err = env.fails(&[
        "tools",
        "approve",
        "gh",
        "delete_repo",
        "--hash",
        &"c".repeat(64),
    ]);
    assert!(err.contains("changed since it was reviewed"), "{err}");
    assert!(
        err.contains(&"c".repeat(64)) && err.contains(&hash),
        "both hashes: {err}"
    );
    env.ok(&[
        "tools",
        "approve",
        "gh",
        "delete_repo",
        "--hash",
        &hash[..12],
    ]);
    assert!(
        store
            .tool_classification("gh", "delete_repo")
            .await
            .unwrap()
            .unwrap()
            .is_callable()
    );

    env.ok(&["tools", "classify", "gh", "delete_repo", "--tier", "none"]);
    assert_eq!(
        store
            .tool_classification("gh", "delete_repo")
            .await
            .unwrap()
            .unwrap()
            .tier,
        None
    );
    let err = env.fails(&["tools", "quarantine", "gh", "nope"]);
    assert!(err.contains("gh/nope"), "{err}");
    let err = env.fails(&["tools", "approve", "gh", "nope"]);
    assert!(err.contains("no recorded tool gh/nope"), "{err}");
}

#[tokio::test]
async fn approvals_list_approve_deny_once() {
    let env = Env::new();
    let store = env.store().await;
    let expires = now_ms() + 3_600_000;
    let args = json!({"repo": "manifold", "token": "[redacted]"});
    let a = store
        .create_approval("token:abc", "gh__delete_repo", "h1", &args, expires)
        .await
        .unwrap();
    let b = store
        .create_approval("token:abc", "gh__archive", "h2", &json!({}), expires)
        .await
        .unwrap();

    let list = env.ok(&["approvals", "list"]);
    let r = row(&list, &a);
    assert!(
        r.contains("token:abc") && r.contains("gh__delete_repo"),
        "{r}"
    );
    assert!(r.contains(r#""repo":"manifold""#), "{r}");
    assert!(row(&list, &b).contains("gh__archive"));

    let out = env.ok(&["approvals", "approve", &a, "--by", "alice"]);
    assert!(out.contains(&format!("approval {a}: approved")), "{out}");
    assert!(out.contains("decided by: alice"), "{out}");
    let err = env.fails(&["approvals", "deny", &a]);
    assert!(err.contains("already decided"), "{err}");

    let out = env.ok(&["approvals", "deny", &b]);
    assert!(out.contains("denied"), "{out}");
    let by = store
        .get_approval(&b)
        .await
        .unwrap()
        .unwrap()
        .decided_by
        .unwrap();
    assert!(by == "cli" || by.starts_with("cli:"), "{by}");

    let pending: Value = serde_json::from_str(&env.ok(&["approvals", "list", "--json"])).unwrap();
    assert_eq!(pending, json!([]));
    let err = env.fails(&["approvals", "approve", "apr_missing"]);
    assert!(err.contains("no such approval"), "{err}");
}

#[tokio::test]
async fn audit_tail_and_export_are_json_lines() {
    let env = Env::new();
    let store = env.store().await;
    let audit = AuditWriter::start(store.clone(), AuditCommit::Sync);
    let now = now_ms();
    let old = now - 2 * 3_600_000;
    audit
        .record(AuditRow::Access(AccessEvent::failure(
            old,
            None,
            "malformed",
        )))
        .await
        .unwrap();
    audit
        .record(AuditRow::Discovery(DiscoveryEvent::new(
            now - 2000,
            "token:t",
            None,
            &["gh__a"],
        )))
        .await
        .unwrap();
    for i in 0..3 {
        audit
            .record(AuditRow::Activity(ActivityEvent {
                at: now - 1000 + i,
                principal: "token:t".into(),
                token_id: None,
                tool: format!("gh__t{i}"),
                args_hash: "h".into(),
                decision: Decision::Allowed,
                approval_id: None,
                outcome: CallOutcome::Success,
                latency_ms: 5,
                bytes_in: 1,
                bytes_out: 2,
                details: json!({}),
            }))
            .await
            .unwrap();
    }
    audit.flush().await.unwrap();

    let parse = |text: &str| -> Vec<Value> {
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect()
    };
    let all = parse(&env.ok(&["audit", "tail"]));
    let kinds: Vec<&str> = all.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["access", "discovery", "activity", "activity", "activity"]
    );
    let times: Vec<i64> = all
        .iter()
        .map(|r| r["created_at"].as_i64().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");

    let two = parse(&env.ok(&["audit", "tail", "-n", "2"]));
    assert_eq!(two.len(), 2);
    assert_eq!(two[1]["tool"], "gh__t2");
    let act = parse(&env.ok(&["audit", "tail", "--kind", "activity", "-n", "1"]));
    assert_eq!(act.len(), 1);
    assert_eq!(act[0]["tool"], "gh__t2");

    let recent = parse(&env.ok(&["audit", "export", "--since", "1h"]));
    assert_eq!(recent.len(), 4, "the old access row is left out");
    let since_ms = parse(&env.ok(&["audit", "export", "--since", &old.to_string()]));
    assert_eq!(since_ms.len(), 5);
    let access = parse(&env.ok(&["audit", "export", "--kind", "access"]));
    assert_eq!(access.len(), 1);
    assert_eq!(access[0]["reason"], "malformed");
    let err = env.fails(&["audit", "export", "--since", "yesterday"]);
    assert!(err.contains("--since"), "{err}");
}

#[test]
fn a_missing_config_is_a_clear_error() {
    let env = Env::new();
    let missing = env.config.with_file_name("nope.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_manifold"))
        .args(["token", "list", "--config"])
        .arg(&missing)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot read config"), "{err}");
}
