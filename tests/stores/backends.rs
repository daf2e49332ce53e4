//! Says which store backends this build of the tests leaves out. The server suites are compiled only
//! with their cargo features, so a plain `cargo test --workspace` would otherwise pass without a word
//! about them; each line says how to run what was left out. (The suites themselves say when a feature
//! is on but its server's URL is not set.)

use samekey::conformance::skipped;

const ALL: &str =
    "run `eval \"$(scripts/services start)\"`, then `cargo test --workspace --all-features`";

#[test]
fn backends_left_out_of_this_build() {
    if !cfg!(feature = "sqlite") {
        skipped("the SQLite suites need `--features sqlite` (no server): `cargo test --workspace --features sqlite`");
    }
    if !cfg!(feature = "postgres") {
        skipped(&format!(
            "the PostgreSQL suites need `--features postgres` and SAMEKEY_PG_URL: {ALL}"
        ));
    }
    if !cfg!(feature = "mysql") {
        skipped(&format!(
            "the MySQL suites need `--features mysql` and SAMEKEY_MYSQL_URL: {ALL}"
        ));
    }
    if !cfg!(feature = "redis") {
        skipped(&format!(
            "the Redis suites need `--features redis` and SAMEKEY_REDIS_URL: {ALL}"
        ));
    }
}
