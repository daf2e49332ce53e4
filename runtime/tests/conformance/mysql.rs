//! The store conformance suite on MySQL or MariaDB. Needs a server: `SAMEKEY_MYSQL_URL` (see
//! `scripts/services`); without it every test prints that it was skipped.
#![cfg(feature = "mysql")]

use std::sync::Arc;

use samekey_runtime::store::MySqlStore;

async fn store() -> Option<Arc<MySqlStore>> {
    let Ok(url) = std::env::var("SAMEKEY_MYSQL_URL") else {
        samekey_runtime::conformance::skipped(
            "set SAMEKEY_MYSQL_URL (scripts/services start) to run the MySQL suite",
        );
        return None;
    };
    Some(Arc::new(
        MySqlStore::connect(&url)
            .await
            .expect("connect to SAMEKEY_MYSQL_URL"),
    ))
}

samekey_runtime::store_conformance_tests!(optional: store().await);

/// Migrating again, and from several instances at once, changes nothing and fails nothing.
#[tokio::test]
async fn migrate_is_idempotent_and_safe_from_several_instances() {
    let Some(store) = store().await else {
        return;
    };
    let runs = (0..4).map(|_| {
        let store = store.clone();
        tokio::spawn(async move { store.migrate().await })
    });
    for run in runs {
        run.await.expect("join").expect("migrate");
    }
}
