//! Opening a store from its URL, with errors an operator can act on: the backends' own
//! [`open_existing`](samekey_runtime::store::open_existing), which knows their schemes.

use std::sync::Arc;

use samekey_runtime::store::{open_existing, OpenError, OpenOptions};
use samekey_runtime::Store;

use crate::Failure;

/// Opens the store `url` names. An SQLite file, a PostgreSQL or a MySQL database must hold samekey's
/// tables (a typo must not create an empty store); an older schema is brought up to date, as a
/// service of this version does when it starts.
pub async fn open(url: &str, redis_prefix: &str) -> Result<Arc<dyn Store>, Failure> {
    let options = OpenOptions::default().key_prefix(redis_prefix);
    open_existing(url, &options).await.map_err(|e| match e {
        OpenError::UnknownScheme { .. } => Failure::usage(e.to_string()),
        _ => Failure::store(e.to_string()),
    })
}
