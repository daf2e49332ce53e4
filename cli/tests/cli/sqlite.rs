//! The built `samekey` binary against a real SQLite store: what it prints for people (pinned as
//! snapshots) and machines, what it changes, and its exit codes.
//!
//! (Was `tests/cli.rs`; its snapshots are `snapshots/cli__sqlite__*.snap`.)
#![cfg(feature = "sqlite")]

use crate::support;

use std::path::PathBuf;

use samekey_runtime::store::{Claim, Claimed, Completion, SqliteStore};
use samekey_runtime::{CallId, Store};
use support::{fixed_call, plant, run, samekey, stdout, Planted, T0};

/// 2026-11-30T12:00:00Z: three hours after the planted calls.
const NOW: &str = "2026-11-30T12:00:00Z";

fn fresh_path() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "samekey-cli-{:x}",
        samekey_runtime::TraceId::new().as_u128()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("s.db")
}

/// A fresh SQLite store planted at `T0` with fixed callIds, and its URL.
async fn planted() -> (String, Planted, SqliteStore) {
    let path = fresh_path();
    let store = SqliteStore::open(&path).await.unwrap();
    let planted = plant(&store, "orders.charge", T0, fixed_call).await;
    (format!("sqlite:{}", path.display()), planted, store)
}

/// The command on `url`, judged as of `NOW`.
fn at_now(url: &str) -> assert_cmd::Command {
    let mut cmd = samekey(url);
    cmd.args(["--now", NOW]);
    cmd
}

fn write(name: &str, text: &str) -> PathBuf {
    let path = fresh_path().with_file_name(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test]
async fn what_people_read_is_pinned() {
    let (url, p, _store) = planted().await;
    let paid = p.paid.to_string();
    let unknown = p.unknown.to_string();
    insta::assert_snapshot!("inspect", stdout(at_now(&url).args(["inspect", &paid])));
    insta::assert_snapshot!(
        "ls",
        stdout(at_now(&url).args(["ls", "--since", "2026-11-30T00:00:00Z"]))
    );
    insta::assert_snapshot!("stats", stdout(at_now(&url).args(["stats"])));
    let (code, audit, _) = run(at_now(&url).args(["audit"]));
    assert_eq!(code, 1, "{audit}");
    insta::assert_snapshot!("audit", audit);
    insta::assert_snapshot!(
        "compensation_ls",
        stdout(at_now(&url).args(["compensation", "ls"]))
    );
    insta::assert_snapshot!(
        "compensation_show",
        stdout(at_now(&url).args(["compensation", "show", &unknown]))
    );
    let remote = write(
        "settlement.csv",
        &format!(
            "call_id,status,amount\n{paid},succeeded,500\n{},succeeded,900\n{unknown},succeeded,300\n{},succeeded,100\n",
            p.twice,
            fixed_call(9, "api-9")
        ),
    );
    let (code, report, _) = run(at_now(&url).args([
        "reconcile",
        "--since",
        "2026-11-30T00:00:00Z",
        "--until",
        "2026-12-01T00:00:00Z",
        "--amount",
        "/amount",
        "--remote",
        remote.to_str().unwrap(),
    ]));
    assert_eq!(code, 1, "{report}");
    insta::assert_snapshot!("reconcile", report);
}

#[tokio::test]
async fn audit_finds_what_needs_a_person_and_passes_a_clean_store() {
    let (url, p, _store) = planted().await;
    let (code, out, _) = run(at_now(&url).args(["audit", "--json"]));
    assert_eq!(code, 1);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let found: Vec<(String, String)> = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["kind"].as_str().unwrap().to_owned(),
                f["call_id"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    let want = [
        ("double_execution", p.twice.to_string()),
        ("stuck_processing", p.stuck.to_string()),
        ("old_unknown", p.unknown.to_string()),
        ("manual", p.unknown.to_string()),
    ];
    for (kind, call) in want {
        assert!(
            found.contains(&(kind.to_owned(), call.clone())),
            "{kind} {call} not in {found:?}"
        );
    }
    assert_eq!(found.len(), 4, "{found:?}");
    // Younger than the threshold, an UNKNOWN is not yet a finding; MANUAL still is.
    let (_, young, _) = run(at_now(&url).args(["audit", "--jsonl", "--unknown-older-than", "4h"]));
    assert!(
        !young.contains("old_unknown") && young.contains("manual"),
        "{young}"
    );

    // A store holding only settled calls is clean: exit 0, for cron and CI.
    let path = fresh_path();
    let store = SqliteStore::open(&path).await.unwrap();
    let call = fixed_call(1, "api-1");
    let key = support::key_of("orders.charge", 1);
    let claim = Claim {
        key: key.clone(),
        call_id: call,
        fingerprint: None,
        lease_ms: 30_000,
        now_ms: T0,
    };
    let Claimed::Acquired(fence) = store.claim(claim).await.unwrap() else {
        panic!()
    };
    let done = Completion {
        state: samekey_runtime::ReceiptState::Success,
        outcome: None,
        ttl_ms: 10 * 365 * 86_400_000,
    };
    store.complete(&key, fence, done, T0).await.unwrap();
    let clean = stdout(at_now(&format!("sqlite:{}", path.display())).args(["audit"]));
    assert_eq!(
        clean,
        "clean: 1 receipts, 0 journals, 0 queued entries read\n"
    );
}

#[tokio::test]
async fn the_queue_is_worked_by_hand_and_journaled_with_who_and_why() {
    let (url, p, _store) = planted().await;
    let unknown = p.unknown.to_string();
    let retried = stdout(at_now(&url).args([
        "compensation",
        "retry",
        &unknown,
        "--by",
        "alice",
        "--reason",
        "provider is back",
    ]));
    assert!(retried.contains("due now"), "{retried}");
    let queue = stdout(at_now(&url).args(["compensation", "ls", "--jsonl"]));
    assert!(queue.contains(r#""state":"PENDING""#), "{queue}");
    stdout(at_now(&url).args([
        "compensation",
        "escalate",
        &unknown,
        "--by",
        "alice",
        "--reason",
        "needs a ticket",
    ]));
    let (code, _, err) = run(at_now(&url).args([
        "compensation",
        "resolve",
        &unknown,
        "--as",
        "succeeded",
        "--reason",
        "x",
    ]));
    assert_eq!(code, 2, "--outcome is required to record a success: {err}");
    let resolved = stdout(at_now(&url).args([
        "compensation",
        "resolve",
        &unknown,
        "--as",
        "succeeded",
        "--outcome",
        r#"{"charge":"ch_3","amount":500}"#,
        "--by",
        "bob",
        "--reason",
        "on the provider's dashboard",
    ]));
    assert!(resolved.contains("recorded SUCCESS"), "{resolved}");
    let timeline = stdout(at_now(&url).args(["inspect", &unknown]));
    for line in [
        "state     SUCCESS",
        r#"outcome   {"amount":500,"charge":"ch_3"}"#,
        "retried by hand (by alice: provider is back)",
        "escalated by hand (by alice: needs a ticket)",
        "resolved by hand as SUCCESS by bob (on the provider's dashboard)",
    ] {
        assert!(timeline.contains(line), "{line:?} not in {timeline}");
    }
    assert_eq!(
        stdout(at_now(&url).args(["compensation", "ls"]))
            .lines()
            .last(),
        Some("(0 entries)")
    );
    let (code, _, err) =
        run(at_now(&url).args(["compensation", "retry", &unknown, "--reason", "again"]));
    assert_eq!(code, 4, "{err}");
    assert_eq!(
        err,
        format!("samekey: no compensation entry for call {unknown}\n")
    );
}

#[tokio::test]
async fn forget_frees_a_finished_key_and_refuses_the_rest() {
    let (url, p, _store) = planted().await;
    let (code, _, err) = run(at_now(&url).args(["forget", p.stuck.as_ref(), "--reason", "redo"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("is PROCESSING, not finished"), "{err}");
    let (code, _, err) = run(at_now(&url).args([
        "forget",
        "--key",
        &p.unknown_key.to_hex(),
        "--reason",
        "redo",
    ]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("resolve it first"), "{err}");

    let forgot = stdout(at_now(&url).args([
        "forget",
        "--scope",
        "orders.charge",
        "--part",
        "u64:42",
        "--part",
        "str:charge",
        "--by",
        "carol",
        "--reason",
        "ticket 4711: customer redoes the order",
    ]));
    assert!(
        forgot.starts_with(&format!("forgot call {} (SUCCESS)", p.paid)),
        "{forgot}"
    );
    let history = stdout(at_now(&url).args(["inspect", p.paid.as_ref()]));
    assert!(history.contains("receipt   none"), "{history}");
    assert!(
        history.contains("forgotten by carol (ticket 4711: customer redoes the order)"),
        "{history}"
    );
    let (code, _, _) =
        run(at_now(&url).args(["forget", "--key", &p.paid_key.to_hex(), "--reason", "again"]));
    assert_eq!(code, 4);
}

#[tokio::test]
async fn purge_counts_then_evicts_the_expired() {
    let (url, _p, store) = planted().await;
    let key = support::key_of("orders.charge", 99);
    let claim = Claim {
        key: key.clone(),
        call_id: fixed_call(99, "api-1"),
        fingerprint: None,
        lease_ms: 30_000,
        now_ms: T0,
    };
    let Claimed::Acquired(fence) = store.claim(claim).await.unwrap() else {
        panic!()
    };
    let short = Completion {
        state: samekey_runtime::ReceiptState::Success,
        outcome: None,
        ttl_ms: 60_000,
    };
    store.complete(&key, fence, short, T0).await.unwrap();
    let dry = stdout(at_now(&url).args(["purge", "--expired", "--dry-run"]));
    assert_eq!(
        dry,
        "1 expired receipts would be evicted (dry run: nothing was)\n"
    );
    assert_eq!(
        store.count_expired(T0 + 3_600_000).await.unwrap(),
        1,
        "nothing evicted"
    );
    let done = stdout(at_now(&url).args(["purge", "--expired", "--json"]));
    assert_eq!(done.trim(), "{\n  \"dry_run\": false,\n  \"expired\": 1\n}");
    let again = stdout(at_now(&url).args(["purge", "--expired", "--dry-run"]));
    assert!(again.starts_with("0 expired"), "{again}");
    let (code, _, err) = run(at_now(&url).args(["purge"]));
    assert_eq!(
        code, 2,
        "purge removes only what expired, and says so: {err}"
    );
}

#[tokio::test]
async fn reconcile_matches_a_file_without_call_ids_by_reference() {
    let (url, p, _store) = planted().await;
    let bank = write(
        "bank.csv",
        "reference,status,amount\n42,paid,500\n43,paid,300\n99,paid,1\n",
    );
    let range = [
        "reconcile",
        "--since",
        "2026-11-30T00:00:00Z",
        "--until",
        "2026-12-01T00:00:00Z",
        "--amount",
        "/amount",
        "--by-reference",
        "orders.charge",
        "--part",
        "u64:{}",
        "--part",
        "str:charge",
        "--json",
        "--remote",
    ];
    let (code, out, _) = run(at_now(&url).args(range).arg(&bank));
    assert_eq!(code, 1, "{out}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["remote_records"], 3);
    assert_eq!(report["matched"], 1, "order 42, paid 500: {report:#}");
    assert_eq!(report["state_mismatches"], 1, "order 43 is UNKNOWN here");
    assert_eq!(report["missing_here"], 1, "order 99");
    let examples = report["examples"].as_array().unwrap();
    assert!(examples
        .iter()
        .any(|e| e["kind"] == "missing_here" && e["reference"] == "99" && e["call_id"].is_null()));
    assert!(examples
        .iter()
        .any(|e| e["kind"] == "state_mismatch" && e["call_id"] == p.unknown.to_string()));

    let (code, _, err) = run(at_now(&url)
        .args([
            "reconcile",
            "--since",
            "24h",
            "--by-reference",
            "orders.charge",
        ])
        .args(["--part", "str:charge", "--remote"])
        .arg(&bank));
    assert_eq!(code, 2);
    assert!(err.contains("one part must hold the reference"), "{err}");
}

#[tokio::test]
async fn reconcile_exits_by_what_it_found() {
    let (url, p, _store) = planted().await;
    let range = [
        "reconcile",
        "--since",
        "2026-11-30T00:00:00Z",
        "--until",
        "2026-12-01T00:00:00Z",
        "--state",
        "success",
        "--amount",
        "/amount",
        "--remote",
    ];
    let agree = write(
        "agree.jsonl",
        &format!(
            "{{\"call_id\":\"{}\",\"status\":\"succeeded\",\"amount\":500}}\n\n{{\"call_id\":\"{}\",\"status\":\"succeeded\",\"amount\":700}}\n",
            p.paid, p.twice
        ),
    );
    let clean = stdout(at_now(&url).args(range).arg(&agree));
    assert!(clean.contains("clean: both sides agree"), "{clean}");
    let report: serde_json::Value =
        serde_json::from_str(&stdout(at_now(&url).args(range).arg(&agree).arg("--json"))).unwrap();
    assert_eq!(report["matched"], 2);

    let broken = write(
        "broken.jsonl",
        &format!(
            "{{\"call_id\":\"{}\",\"status\":\"succeeded\",\"amount\":500}}\nnot json\n",
            p.paid
        ),
    );
    let (code, out, _) = run(at_now(&url).args(range).arg(&broken).arg("--jsonl"));
    assert_eq!(code, 1, "{out}");
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["kind"] == "unreadable" && l["record"] == 2),
        "{out}"
    );
    assert!(lines.iter().any(|l| l["kind"] == "missing_there"), "{out}");
    assert_eq!(lines.last().unwrap()["summary"]["clean"], false);

    let (code, _, err) = run(at_now(&url).args(range).arg("/nonexistent/settlement.csv"));
    assert_eq!(code, 2);
    assert!(
        err.starts_with("samekey: cannot read /nonexistent/settlement.csv"),
        "{err}"
    );
    let (code, _, err) = run(at_now(&url).args(range).arg(&url[7..]));
    assert_eq!(code, 2, "a file without a known extension: {err}");
}

#[tokio::test]
async fn machines_get_json_and_pipes_get_no_colours_or_progress() {
    let (url, p, _store) = planted().await;
    let paid = p.paid.to_string();
    let json: serde_json::Value =
        serde_json::from_str(&stdout(at_now(&url).args(["inspect", &paid, "--json"]))).unwrap();
    assert_eq!(json["receipt"]["state"], "SUCCESS");
    assert_eq!(json["timeline"][2]["event"], "backoff");
    let (_, out, err) = run(at_now(&url).args(["audit"]));
    assert!(!out.contains('\x1b') && err.is_empty(), "{out:?} {err:?}");
    let local = stdout(
        at_now(&url)
            .env("TZ", "Asia/Tokyo")
            .args(["inspect", &paid, "--local"]),
    );
    assert!(
        local.contains("created   2026-11-30T18:00:00.000+09:00"),
        "{local}"
    );
    let paged = stdout(at_now(&url).args(["ls", "--limit", "1"]));
    let next = paged
        .lines()
        .last()
        .unwrap()
        .strip_prefix("next: ")
        .unwrap()
        .to_owned();
    let rest: Vec<&str> = next.split_whitespace().collect();
    let second = stdout(at_now(&url).args(["ls", "--limit", "3", rest[0], rest[1]]));
    let by_node = stdout(at_now(&url).args(["ls", "--node", "api-3", "--jsonl"]));
    assert_eq!(by_node.lines().count(), 1, "{by_node}");
    assert!(by_node.contains(&p.stuck.to_string()), "{by_node}");
    let rows: Vec<&str> = second
        .lines()
        .filter(|l| l.contains("orders.charge"))
        .collect();
    assert_eq!(
        rows.len(),
        3,
        "the other three, after the first page: {second}"
    );
    assert!(!paged
        .lines()
        .nth(1)
        .is_some_and(|first| rows.contains(&first)));
}

#[tokio::test]
async fn mistakes_get_a_message_and_an_exit_code() {
    let (url, _p, _store) = planted().await;
    let no_store = assert_cmd::Command::cargo_bin("samekey")
        .unwrap()
        .env_remove("SAMEKEY_STORE")
        .arg("ls")
        .output()
        .unwrap();
    assert_eq!(no_store.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&no_store.stderr).contains("no store"));
    let missing = samekey("sqlite:/nonexistent/samekey.db")
        .arg("ls")
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(3));
    // A file that is not a samekey store is not made into one.
    let other = fresh_path();
    let options = samekey_runtime::sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&other)
        .create_if_missing(true);
    let pool = samekey_runtime::sqlx::SqlitePool::connect_with(options)
        .await
        .unwrap();
    samekey_runtime::sqlx::query("CREATE TABLE orders (id INTEGER)")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let other_url = format!("sqlite:{}", other.display());
    let (code, _, err) = run(samekey(&other_url).arg("ls"));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("holds no samekey tables"), "{err}");
    let (_, _, err) = run(samekey(&other_url).arg("ls"));
    assert!(
        err.contains("holds no samekey tables"),
        "nothing was created: {err}"
    );
    let bad_url = samekey("mongodb://x").arg("ls").output().unwrap();
    assert_eq!(bad_url.status.code(), Some(2));
    let stranger = CallId::new("pay", "elsewhere").unwrap().to_string();
    let unknown = samekey(&url).args(["inspect", &stranger]).output().unwrap();
    assert_eq!(unknown.status.code(), Some(4));
    let not_an_id = samekey(&url).args(["inspect", "nope"]).output().unwrap();
    assert_eq!(not_an_id.status.code(), Some(2));
    let bad_time = samekey(&url)
        .args(["ls", "--since", "yesterday"])
        .output()
        .unwrap();
    assert_eq!(bad_time.status.code(), Some(2));
    for output in [&missing, &unknown, &not_an_id, &bad_time] {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.starts_with("samekey: ") && !stderr.contains("panicked"),
            "{stderr}"
        );
    }
    for command in [
        "inspect",
        "ls",
        "stats",
        "audit",
        "compensation",
        "reconcile",
        "purge",
        "forget",
    ] {
        let help = stdout(samekey(&url).args([command, "--help"]));
        assert!(help.contains("samekey "), "{command}: {help}");
    }
}
