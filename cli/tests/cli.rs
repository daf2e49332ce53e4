//! The built `samekey` binary against a real SQLite store: what it prints for people and machines, and
//! its exit codes.
#![cfg(feature = "sqlite")]

use std::sync::Arc;

use assert_cmd::Command;
use samekey_runtime::store::{Claim, Claimed, Completion, SqliteStore};
use samekey_runtime::{CallId, Event, Key, KeyBuilder, ReceiptState, Store, What};

struct Planted {
    path: String,
    paid: CallId,
    unknown: CallId,
    paid_key: Key,
}

/// A store holding a paid call (retried once, journaled), and a call left UNKNOWN.
async fn plant() -> Planted {
    let dir = std::env::temp_dir().join(format!(
        "samekey-cli-{:x}",
        samekey_runtime::TraceId::new().as_u128()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.db");
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let key_of = |order: u64| {
        let mut key = KeyBuilder::new("orders.charge");
        key.part(&order);
        key.part("charge");
        key.finish()
    };
    let claim = |key: &Key, call_id: &CallId| Claim {
        key: key.clone(),
        call_id: call_id.clone(),
        fingerprint: None,
        lease_ms: 60_000,
        now_ms: now,
    };
    let paid = CallId::new("pay", "api-1").unwrap();
    let paid_key = key_of(42);
    let Claimed::Acquired(fence) = store.claim(claim(&paid_key, &paid)).await.unwrap() else {
        panic!()
    };
    let event = |what| Event {
        call_id: paid.clone(),
        at_ms: now,
        node: "api-1".into(),
        what,
    };
    let events = [
        event(What::Claimed { fence: fence.0 }),
        event(What::Backoff {
            attempt: 1,
            delay_ms: 100,
        }),
    ];
    store
        .append_journal(&paid_key, &events, 60_000, now)
        .await
        .unwrap();
    let done = Completion {
        state: ReceiptState::Success,
        outcome: Some(Arc::from(&br#"{"charge":7}"#[..])),
        ttl_ms: 86_400_000,
    };
    store.complete(&paid_key, fence, done, now).await.unwrap();
    let unknown = CallId::new("pay", "api-1").unwrap();
    let Claimed::Acquired(fence) = store.claim(claim(&key_of(43), &unknown)).await.unwrap() else {
        panic!()
    };
    store.mark_unknown(&key_of(43), fence, now).await.unwrap();
    Planted {
        path: format!("sqlite:{}", path.display()),
        paid,
        unknown,
        paid_key,
    }
}

fn samekey(store: &str) -> Command {
    let mut cmd = Command::cargo_bin("samekey").unwrap();
    cmd.env("SAMEKEY_STORE", store);
    cmd
}

fn stdout(cmd: &mut Command) -> String {
    let output = cmd.output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[tokio::test]
async fn inspect_shows_the_receipt_and_the_timeline() {
    let planted = plant().await;
    let paid = planted.paid.to_string();
    let text = stdout(samekey(&planted.path).args(["inspect", paid.as_str()]));
    assert!(
        text.contains(&format!("call      {}", planted.paid)),
        "{text}"
    );
    assert!(text.contains("state     SUCCESS"), "{text}");
    assert!(text.contains(r#"outcome   {"charge":7}"#), "{text}");
    assert!(text.contains("backing off 100 ms"), "{text}");
    assert!(text.contains("recorded SUCCESS by call"), "{text}");

    // The same call by its key: as a digest, and as its scope and typed parts.
    let by_digest =
        stdout(samekey(&planted.path).args(["inspect", "--key", &planted.paid_key.to_hex()]));
    assert!(by_digest.contains(&planted.paid.to_string()), "{by_digest}");
    let by_parts = stdout(samekey(&planted.path).args([
        "inspect",
        "--scope",
        "orders.charge",
        "--part",
        "u64:42",
        "--part",
        "str:charge",
    ]));
    assert!(by_parts.contains(&planted.paid.to_string()), "{by_parts}");

    // For machines: one JSON document.
    let json: serde_json::Value = serde_json::from_str(&stdout(samekey(&planted.path).args([
        "inspect",
        paid.as_str(),
        "--json",
    ])))
    .unwrap();
    assert_eq!(json["receipt"]["state"], "SUCCESS");
    assert_eq!(json["timeline"][1]["event"], "backoff");
}

#[tokio::test]
async fn ls_and_stats_list_and_count() {
    let planted = plant().await;
    let table = stdout(samekey(&planted.path).args(["ls"]));
    assert!(table.starts_with("CREATED"), "{table}");
    assert!(
        table.contains(&planted.paid.to_string()) && table.contains(&planted.unknown.to_string())
    );
    assert!(table.contains("(2 receipts)"), "{table}");
    let unknown = stdout(samekey(&planted.path).args(["ls", "--state", "unknown", "--jsonl"]));
    let lines: Vec<serde_json::Value> = unknown
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["call_id"], planted.unknown.to_string());
    let paged = stdout(samekey(&planted.path).args(["ls", "--limit", "1"]));
    let next = paged
        .lines()
        .last()
        .unwrap()
        .strip_prefix("next: ")
        .unwrap()
        .to_owned();
    let rest: Vec<&str> = next.split_whitespace().collect();
    let second = stdout(samekey(&planted.path).args(["ls", "--limit", "1", rest[0], rest[1]]));
    assert!(
        second.contains("(1 receipts)") || second.contains("next:"),
        "{second}"
    );
    let stats: serde_json::Value =
        serde_json::from_str(&stdout(samekey(&planted.path).args(["stats", "--json"]))).unwrap();
    assert_eq!(stats["total"], 2);
}

#[tokio::test]
async fn mistakes_get_a_message_and_an_exit_code() {
    let planted = plant().await;
    let no_store = Command::cargo_bin("samekey")
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
    let bad_url = samekey("mysql://x").arg("ls").output().unwrap();
    assert_eq!(bad_url.status.code(), Some(2));
    let stranger = CallId::new("pay", "elsewhere").unwrap().to_string();
    let unknown = samekey(&planted.path)
        .args(["inspect", &stranger])
        .output()
        .unwrap();
    assert_eq!(unknown.status.code(), Some(4));
    let not_an_id = samekey(&planted.path)
        .args(["inspect", "nope"])
        .output()
        .unwrap();
    assert_eq!(not_an_id.status.code(), Some(2));
    let bad_time = samekey(&planted.path)
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
}
