//! [`PgStore::migrate`]: the schema, and what a database of an earlier release needs.
//!
//! # Guarantees
//!
//! * **Idempotent, and safe from every instance at once.** One instance migrates at a time (a session
//!   advisory lock, waited for by asking, not by blocking in a statement); the others find the work
//!   done. An instance starting on a migrated database takes no lock at all.
//! * **Writes go on while a later index builds**: the indexes a later release added to a table that
//!   may be large are built `CONCURRENTLY`, outside the schema's transaction, and one whose build
//!   failed half-way is dropped and built again.
//! * **Every value of an earlier release is kept**: times kept as `BIGINT` Unix ms become
//!   `timestamptz`, to the millisecond (each table rewritten once, in the schema's transaction, which
//!   holds the table's readers and writers while it runs).

use sqlx::PgConnection;

use super::PgStore;
use crate::error::StoreError;
use crate::store::sql::rows::driver;

/// The schema, idempotent (`schema.sql`): run by [`PgStore::migrate`] under an advisory lock, so that
/// instances starting together do not race. It also brings the tables of an earlier release, whose
/// times were `BIGINT` Unix ms, to `timestamptz` (each column rewritten once, every value kept to the
/// millisecond).
const SCHEMA: &str = include_str!("schema.sql");

impl PgStore {
    /// The indexes added to an existing table by a later release: built `CONCURRENTLY`, outside the
    /// schema's transaction, so that building them on a large `samekey_receipts` does not stop claims
    /// and completions meanwhile. (Name, how to build it, how to drop a failed build.)
    const LATER_INDEXES: [(&'static str, &'static str, &'static str); 3] = [
        (
            "samekey_receipts_orphans",
            include_str!("migrations/receipts_orphans.sql"),
            "DROP INDEX CONCURRENTLY IF EXISTS samekey_receipts_orphans",
        ),
        (
            "samekey_receipts_created",
            include_str!("migrations/receipts_created.sql"),
            "DROP INDEX CONCURRENTLY IF EXISTS samekey_receipts_created",
        ),
        (
            "samekey_receipts_scope_created",
            include_str!("migrations/receipts_scope_created.sql"),
            "DROP INDEX CONCURRENTLY IF EXISTS samekey_receipts_scope_created",
        ),
    ];

    /// Creates the sequence, tables and indexes if they are missing. Idempotent, and safe to run from
    /// several instances at once (an advisory lock serializes them). The indexes a later release added
    /// are built `CONCURRENTLY`: an upgrade on a large table does not block writes while they build,
    /// and an index whose build failed half-way is dropped and built again. Times an earlier release
    /// kept as `BIGINT` Unix ms become `timestamptz`, every value kept: that rewrites each table once,
    /// in the schema's transaction, and holds the table's readers and writers while it runs.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        // The usual case, an instance starting on a migrated database, takes no lock at all:
        // `CREATE INDEX IF NOT EXISTS` would lock the table against writers before finding the index.
        if self.migrated().await? {
            return Ok(());
        }
        // One instance migrates at a time. The lock is a session's, and waited for by asking (not
        // by blocking in a statement): an index built `CONCURRENTLY` waits for every statement
        // older than it, and a statement blocked on this lock would wait for the build.
        let mut conn = self.pool().acquire().await.map_err(driver)?;
        let mut waited = 0u32;
        loop {
            let locked: bool =
                sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtext('samekey.migrate'))")
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(driver)?;
            if locked {
                break;
            }
            if self.migrated().await? {
                return Ok(());
            }
            waited += 1;
            if waited > 1_200 {
                return Err(StoreError::Unavailable(
                    "another instance has been migrating the schema for 2 minutes".into(),
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let migrated = self.migrate_locked(&mut conn).await;
        let unlocked = sqlx::query("SELECT pg_advisory_unlock(hashtext('samekey.migrate'))")
            .execute(&mut *conn)
            .await
            .map_err(driver);
        migrated.and(unlocked.map(drop))
    }

    /// Whether the schema is in place: see [`PgStore::migrated`].
    const MIGRATED_SQL: &'static str = include_str!("migrations/migrated.sql");

    /// Whether the schema, every index of it and its functions are in place (and the indexes valid),
    /// and every time column is a `timestamptz` (an earlier release's `BIGINT` ms are not).
    async fn migrated(&self) -> Result<bool, StoreError> {
        sqlx::query_scalar(Self::MIGRATED_SQL)
            .fetch_one(self.pool())
            .await
            .map_err(driver)
    }

    /// The schema in one transaction, then the later indexes, on `conn`, which holds the migration lock.
    async fn migrate_locked(&self, conn: &mut PgConnection) -> Result<(), StoreError> {
        let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(driver)?;
        sqlx::query("SET LOCAL lock_timeout = '10s'")
            .execute(&mut *tx)
            .await
            .map_err(driver)?;
        sqlx::raw_sql(SCHEMA)
            .execute(&mut *tx)
            .await
            .map_err(driver)?;
        tx.commit().await.map_err(driver)?;
        Self::build_later_indexes(conn).await
    }

    /// Builds [`PgStore::LATER_INDEXES`] one by one, `CONCURRENTLY` (outside any transaction), on
    /// `conn`, which holds the migration lock.
    async fn build_later_indexes(conn: &mut PgConnection) -> Result<(), StoreError> {
        for (name, create, drop) in Self::LATER_INDEXES {
            let valid: Option<bool> = sqlx::query_scalar(
                "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)",
            )
            .bind(name)
            .fetch_optional(&mut *conn)
            .await
            .map_err(driver)?;
            match valid {
                Some(true) => continue,
                // A build that failed half-way leaves an invalid index: drop it, build again.
                Some(false) => {
                    sqlx::raw_sql(drop)
                        .execute(&mut *conn)
                        .await
                        .map_err(driver)?;
                }
                None => {}
            }
            sqlx::raw_sql(create)
                .execute(&mut *conn)
                .await
                .map_err(driver)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// The `(table, column)` rows of the first `VALUES` list in `sql`, whitespace aside.
    fn time_columns(sql: &str) -> Vec<String> {
        let list = sql
            .split_once("(VALUES")
            .and_then(|(_, rest)| rest.split_once(") AS c (tbl, col)"))
            .map(|(list, _)| list)
            .expect("a VALUES list of (table, column)");
        list.split("),")
            .map(|row| row.split_whitespace().collect::<String>())
            .collect()
    }

    /// The schema converts the time columns that the check of a migrated database counts: one list,
    /// written in two files, that must name the same nine columns.
    #[test]
    fn the_schema_and_the_check_name_the_same_time_columns() {
        let converted = time_columns(super::SCHEMA);
        assert_eq!(converted.len(), 9);
        assert!(super::PgStore::MIGRATED_SQL.contains(") = 9"));
        assert_eq!(time_columns(super::PgStore::MIGRATED_SQL), converted);
    }
}
