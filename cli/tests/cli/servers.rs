//! The built `samekey` binary against the shared stores: PostgreSQL (`SAMEKEY_PG_URL`), MySQL
//! (`SAMEKEY_MYSQL_URL`), Redis (`SAMEKEY_REDIS_URL`) and a Redis Cluster
//! (`SAMEKEY_REDIS_CLUSTER_URLS`), each walked through
//! what an operator does: audit, list, inspect, resolve, reconcile, forget, purge. Each suite says
//! `skipped:` when its server is not given (`scripts/services start` gives them all).
#![cfg(all(feature = "postgres", feature = "redis"))]

use crate::support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use samekey_runtime::{CallId, Store};
use support::{plant, run, samekey, stdout};

/// The walk on `url` (with `extra` arguments for every command), under a scope of its own so that
/// what other suites keep in the same store does not count.
async fn walk(url: &str, store: &dyn Store, extra: &[&str]) {
    let scope = format!("cli.{:x}", samekey_runtime::TraceId::new().as_u128());
    let local = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let now = store.now_ms(local).await.unwrap();
    let p = plant(store, &scope, now, |_, node| {
        CallId::new("pay", node).unwrap()
    })
    .await;
    // The crashed owner's 1 ms lease is over.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let cmd = |args: &[&str]| {
        let mut cmd = samekey(url);
        cmd.args(extra).args(args);
        cmd
    };

    let (code, out, err) = run(&mut cmd(&[
        "audit",
        "--scope",
        &scope,
        "--unknown-older-than",
        "0s",
        "--json",
    ]));
    assert_eq!(code, 1, "{out} {err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut kinds: Vec<&str> = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        [
            "double_execution",
            "manual",
            "old_unknown",
            "stuck_processing"
        ],
        "{out}"
    );

    let listed = stdout(&mut cmd(&["ls", "--scope", &scope, "--jsonl"]));
    assert_eq!(listed.lines().count(), 4, "{listed}");
    let stats: serde_json::Value =
        serde_json::from_str(&stdout(&mut cmd(&["stats", "--scope", &scope, "--json"]))).unwrap();
    assert_eq!(stats["total"], 4, "{stats}");
    let timeline = stdout(&mut cmd(&["inspect", p.paid.as_ref()]));
    assert!(timeline.contains("attempt 2: ok"), "{timeline}");
    let queue = stdout(&mut cmd(&["compensation", "ls", "--manual", "--jsonl"]));
    assert!(queue.contains(&p.unknown.to_string()), "{queue}");

    let remote = std::env::temp_dir().join(format!("{scope}.csv"));
    std::fs::write(
        &remote,
        format!(
            "call_id,status\n{},succeeded\n{},succeeded\n",
            p.paid, p.twice
        ),
    )
    .unwrap();
    let clean = stdout(&mut cmd(&[
        "reconcile",
        "--since",
        "1h",
        "--scope",
        &scope,
        "--state",
        "success",
        "--remote",
        remote.to_str().unwrap(),
    ]));
    assert!(clean.contains("clean: both sides agree"), "{clean}");

    let resolved = stdout(&mut cmd(&[
        "compensation",
        "resolve",
        p.unknown.as_ref(),
        "--as",
        "failed",
        "--by",
        "ops",
        "--reason",
        "provider says declined",
    ]));
    assert!(resolved.contains("recorded FAILED"), "{resolved}");
    let settled = stdout(&mut cmd(&["inspect", "--key", &p.unknown_key.to_hex()]));
    assert!(
        settled.contains("state     FAILED")
            && settled.contains("resolved by hand as FAILED by ops (provider says declined)"),
        "{settled}"
    );

    let (code, _, err) = run(&mut cmd(&[
        "forget",
        "--key",
        &p.stuck_key.to_hex(),
        "--reason",
        "x",
    ]));
    assert_eq!(code, 2, "a PROCESSING call is not forgotten: {err}");
    stdout(&mut cmd(&[
        "forget",
        "--key",
        &p.paid_key.to_hex(),
        "--by",
        "ops",
        "--reason",
        "redo",
    ]));
    let (code, _, _) = run(&mut cmd(&[
        "inspect",
        "--key",
        &p.paid_key.to_hex(),
        "--json",
    ]));
    assert_eq!(code, 0, "the journal outlives the forgotten receipt");
    let gone = stdout(&mut cmd(&["ls", "--scope", &scope, "--jsonl"]));
    assert_eq!(gone.lines().count(), 3, "{gone}");

    let dry = stdout(&mut cmd(&["purge", "--expired", "--dry-run", "--json"]));
    let dry: serde_json::Value = serde_json::from_str(&dry).unwrap();
    assert_eq!(dry["dry_run"], true);
}

#[tokio::test]
async fn on_postgres() {
    let Ok(url) = std::env::var("SAMEKEY_PG_URL") else {
        println!(
            "skipped: set SAMEKEY_PG_URL (scripts/services start) to run the command on PostgreSQL"
        );
        return;
    };
    let store = samekey_runtime::store::PgStore::connect(&url)
        .await
        .unwrap();
    walk(&url, &store, &[]).await;

    // A database without samekey's tables, a user the server refuses, a server that is not there:
    // each a one-line message and exit 3, and nothing created.
    let (base, _) = url.rsplit_once('/').unwrap();
    let other = format!("{base}/postgres");
    let stranger = url.replacen("://samekey@", "://nobody@", 1);
    for (url, says) in [
        (other.as_str(), "holds no samekey tables"),
        (stranger.as_str(), "cannot open the store"),
        (
            "postgres://samekey@127.0.0.1:1/samekey",
            "cannot open the store",
        ),
    ] {
        let (code, _, err) = run(samekey(url).arg("ls"));
        assert_eq!(code, 3, "{url}: {err}");
        assert!(
            err.starts_with("samekey: ") && err.contains(says),
            "{url}: {err}"
        );
    }
    let (_, _, err) = run(samekey(&other).arg("ls"));
    assert!(
        err.contains("holds no samekey tables"),
        "nothing was created: {err}"
    );
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn on_mysql() {
    let Ok(url) = std::env::var("SAMEKEY_MYSQL_URL") else {
        println!(
            "skipped: set SAMEKEY_MYSQL_URL (scripts/services start) to run the command on MySQL"
        );
        return;
    };
    let store = samekey_runtime::store::MySqlStore::connect(&url)
        .await
        .unwrap();
    walk(&url, &store, &[]).await;

    // A database without samekey's tables (information_schema, which every user may read), a server
    // that is not there: each a one-line message and exit 3, and nothing created.
    let (base, _) = url.rsplit_once('/').unwrap();
    let other = format!("{base}/information_schema");
    for (url, says) in [
        (other.as_str(), "holds no samekey tables"),
        (
            "mysql://samekey@127.0.0.1:1/samekey",
            "cannot open the store",
        ),
    ] {
        let (code, _, err) = run(samekey(url).arg("ls"));
        assert_eq!(code, 3, "{url}: {err}");
        assert!(
            err.starts_with("samekey: ") && err.contains(says),
            "{url}: {err}"
        );
    }
}

#[tokio::test]
async fn on_redis() {
    let Ok(url) = std::env::var("SAMEKEY_REDIS_URL") else {
        println!(
            "skipped: set SAMEKEY_REDIS_URL (scripts/services start) to run the command on Redis"
        );
        return;
    };
    let prefix = format!("cli{:x}", samekey_runtime::TraceId::new().as_u128() as u32);
    let store = samekey_runtime::store::RedisStore::connect_unverified(&url, &prefix)
        .await
        .unwrap();
    walk(&url, &store, &["--redis-prefix", &prefix]).await;
    let (code, _, err) = run(samekey("redis://127.0.0.1:1/").arg("ls"));
    assert_eq!(code, 3, "{err}");
    assert!(err.starts_with("samekey: cannot open the store"), "{err}");
}

#[tokio::test]
async fn on_a_redis_cluster() {
    let Ok(urls) = std::env::var("SAMEKEY_REDIS_CLUSTER_URLS") else {
        println!("skipped: set SAMEKEY_REDIS_CLUSTER_URLS (scripts/services start) to run the command on a Redis Cluster");
        return;
    };
    let prefix = format!("cli{:x}", samekey_runtime::TraceId::new().as_u128() as u32);
    let nodes: Vec<&str> = urls.split(',').collect();
    let store = samekey_runtime::store::RedisStore::connect_cluster_unverified(&nodes, &prefix)
        .await
        .unwrap();
    walk(&urls, &store, &["--redis-prefix", &prefix]).await;
}
