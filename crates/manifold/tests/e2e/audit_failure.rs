//! `[governance] audit_failure = "refuse"` (the default): audit writes are
//! made to fail while the gateway runs (PostgreSQL: the gateway's role
//! loses `INSERT` on the audit tables; SQLite: a trigger refuses every
//! audit row, and the journal fills). Calls are then answered
//! `audit_unavailable` and not executed, `/readyz` and the admin API say
//! so, and once writing works again calls work by themselves. Every call
//! that answered success has its row.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use manifold_test_postgres::{Backend, TestDatabase, on_both_backends};
use serde_json::{Value, json};
use sqlx::Row;

on_both_backends!(while_audit_rows_cannot_be_made_durable_calls_are_refused_until_they_can);

const AUDIT_TABLES: [&str; 3] = ["activity_audit", "access_audit", "discovery_audit"];

/// Call `n`'s arguments; `big` ones are about 1.1 MiB: with
/// `audit_arguments` on, each call's row holds them, so sixteen fill a
/// SQLite journal.
fn arguments(n: u64, big: bool) -> Value {
    let padding = if big {
        "p".repeat(1_150_000)
    } else {
        String::new()
    };
    json!({ "call": n, "padding": padding })
}

/// Runs `statements` in one transaction: the gateway's writer never sees
/// half a fault (a refused activity row committed with access rows that
/// are not refused is dropped, as a row the database will never take).
async fn execute(url: &str, statements: &[String]) {
    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .unwrap();
    let mut transaction = pool.begin().await.unwrap();
    for statement in statements {
        sqlx::query(statement)
            .execute(&mut *transaction)
            .await
            .unwrap();
    }
    transaction.commit().await.unwrap();
    pool.close().await;
}

/// The numbers of the calls that have a success row, in order.
async fn successes_audited(url: &str) -> Vec<u64> {
    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .unwrap();
    let rows = sqlx::query(
        "SELECT CAST(details AS TEXT) AS details FROM activity_audit \
         WHERE tool = 'files__read_file' AND outcome = 'success'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    let mut calls: Vec<u64> = rows
        .iter()
        .map(|row| {
            let details: Value = serde_json::from_str(row.try_get("details").unwrap()).unwrap();
            details["arguments"]["call"].as_u64().unwrap()
        })
        .collect();
    calls.sort_unstable();
    calls
}

/// How the test takes the audit's writes away and gives them back.
enum Fault {
    /// A role of its own for the gateway, whose `INSERT` is revoked.
    Revoke { role: String },
    /// Triggers that refuse every audit row.
    Trigger,
}

impl Fault {
    /// Prepares `db`; returns the fault and the URL the gateway uses.
    async fn prepare(db: &TestDatabase) -> (Fault, String) {
        drop(db.store().await); // migrated by its owner
        if db.backend() == Backend::Sqlite {
            return (Fault::Trigger, db.url().to_string());
        }
        let role = format!("gw_{}", std::process::id());
        execute(
            db.url(),
            &[
                format!("DROP ROLE IF EXISTS {role}"),
                format!("CREATE ROLE {role} LOGIN"),
                format!("GRANT ALL ON SCHEMA public TO {role}"),
                format!("GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}"),
                format!("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}"),
            ],
        )
        .await;
        let gateway_url = db.url().replacen("postgres@", &format!("{role}@"), 1);
        assert_ne!(gateway_url, db.url());
        (Fault::Revoke { role }, gateway_url)
    }

    async fn break_writes(&self, url: &str) {
        let statements: Vec<String> = match self {
            Fault::Revoke { role } => vec![format!(
                "REVOKE INSERT ON {} FROM {role}",
                AUDIT_TABLES.join(", ")
            )],
            Fault::Trigger => AUDIT_TABLES
                .iter()
                .map(|table| {
                    format!(
                        "CREATE TRIGGER refuse_{table} BEFORE INSERT ON {table} \
                         BEGIN SELECT RAISE(ABORT, 'audit refused by the test'); END"
                    )
                })
                .collect(),
        };
        execute(url, &statements).await;
    }

    async fn restore_writes(&self, url: &str) {
        let statements: Vec<String> = match self {
            Fault::Revoke { role } => vec![format!(
                "GRANT INSERT ON {} TO {role}",
                AUDIT_TABLES.join(", ")
            )],
            Fault::Trigger => AUDIT_TABLES
                .iter()
                .map(|table| format!("DROP TRIGGER refuse_{table}"))
                .collect(),
        };
        execute(url, &statements).await;
    }

    async fn clean_up(&self, url: &str) {
        if let Fault::Revoke { role } = self {
            execute(
                url,
                &[
                    format!("REASSIGN OWNED BY {role} TO postgres"),
                    format!("DROP OWNED BY {role}"),
                    format!("DROP ROLE {role}"),
                ],
            )
            .await;
        }
    }
}

/// A stateless `tools/call` of `files__read_file`; the answer's JSON.
async fn read_file(http: &reqwest::Client, url: &str, bearer: &str, arguments: &Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": "files__read_file", "arguments": arguments}});
    let text = http
        .post(url)
        .bearer_auth(bearer)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let json = text
        .lines()
        .find_map(|l| serde_json::from_str::<Value>(l.trim_start_matches("data:").trim()).ok());
    json.unwrap_or_else(|| panic!("no JSON in {}", cut(&text)))
}

/// The start of a long answer, for a failure message.
fn cut(text: &str) -> String {
    text.chars().take(2000).collect()
}

fn succeeded(answer: &Value) -> bool {
    answer["result"].is_object() && answer["result"]["isError"] != true
}

fn audit_unavailable(answer: &Value) -> bool {
    answer["error"]["data"]["code"] == "audit_unavailable"
}

async fn while_audit_rows_cannot_be_made_durable_calls_are_refused_until_they_can(
    db: TestDatabase,
) {
    let (fault, gateway_url) = Fault::prepare(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let catalog = write_catalog(
        dir.path(),
        "files.jsonl",
        &[(
            "files",
            "read_file",
            "Read a file.",
            json!({"type": "object"}),
        )],
    );
    let count = dir.path().join("files.log");
    let files = fixture_server(
        "files",
        &catalog,
        &["--count-file", &count.display().to_string()],
        "",
    );
    let gw = GatewayProcess::start(&format!(
        "[gateway]\nmode = \"direct\"\n\n[auth]\nrequired = true\n\n\
         [governance]\naudit_arguments = true\n\n\
         [store]\ndatabase_url = {gateway_url:?}\n\n{files}"
    ));
    let config = gw.dir.path().join("manifold.toml");
    let token = |actions: &[&str]| -> String {
        let mut args = vec!["token", "create", "--name", "t", "--json"];
        for action in actions {
            args.extend(["--action", action]);
        }
        let created: Value = serde_json::from_str(&cli(&config, &args)).unwrap();
        created["token"].as_str().unwrap().to_string()
    };
    let (agent, admin) = (token(&["discover", "call"]), token(&["admin"]));
    let http = reqwest::Client::new();
    let base = gw.url.trim_end_matches("/mcp").to_string();
    let calls = || count_requests(&count, "tools/call");
    let audit_unavailable_shown = || async {
        let overview: Value = http
            .get(format!("{base}/admin/overview"))
            .bearer_auth(&admin)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        overview["audit_unavailable"].clone()
    };
    // Each call is numbered (its arguments say which), and the numbers of
    // those answered success are kept.
    let mut numbered: u64 = 0;
    let mut call = |big: bool| {
        numbered += 1;
        let request = arguments(numbered, big);
        let (http, url, agent) = (&http, &gw.url, &agent);
        async move { (numbered, read_file(http, url, agent, &request).await) }
    };
    let mut answered_success = Vec::new();

    let (n, answer) = call(false).await;
    assert!(succeeded(&answer), "{answer}");
    answered_success.push(n);
    assert_eq!(audit_unavailable_shown().await, false);

    fault.break_writes(db.url()).await;
    // Calls go on while their rows are durable: on SQLite, until the
    // journal is full. The call whose row then fails has run, and its
    // answer is withheld.
    let mut while_journaled = 0;
    loop {
        let (n, answer) = call(true).await;
        if audit_unavailable(&answer) {
            break;
        }
        assert!(succeeded(&answer), "{}", cut(&answer.to_string()));
        answered_success.push(n);
        while_journaled += 1;
        assert!(while_journaled <= 16, "the journal took more than 16 MiB");
    }
    match fault {
        Fault::Revoke { .. } => assert_eq!(while_journaled, 0, "PostgreSQL has no journal"),
        Fault::Trigger => assert!(while_journaled >= 8, "{while_journaled} rows journaled"),
    }
    let ran = calls();
    for _ in 0..3 {
        let (_, answer) = call(false).await;
        assert!(audit_unavailable(&answer), "{answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("audit"),
            "{answer}"
        );
    }
    assert_eq!(calls(), ran, "a refused call reached the upstream");
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status().as_u16(), 503);
    assert!(ready.text().await.unwrap().contains("audit"));
    assert_eq!(audit_unavailable_shown().await, true);

    fault.restore_writes(db.url()).await;
    for _ in 0..2 {
        let (n, answer) = call(false).await;
        assert!(succeeded(&answer), "{answer}");
        answered_success.push(n);
    }
    assert_eq!(calls(), ran + 2);
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status().as_u16(), 200);
    assert_eq!(audit_unavailable_shown().await, false);

    // On SQLite the last rows may still be only journaled: wait for them.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let audited = successes_audited(db.url()).await;
        if audited == answered_success || Instant::now() > deadline {
            assert_eq!(
                audited, answered_success,
                "the calls answered success have rows"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(gw);
    fault.clean_up(db.url()).await;
}
