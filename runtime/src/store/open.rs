//! Opening an existing store from its URL, as the `samekey` command and an operator's own tools do:
//! [`open_existing`] asks each backend this build has whether the URL is one of its own, and that
//! backend opens it.
//!
//! A backend is one folder of `store/` (`postgres/`, `redis/`, …): beside its store it implements
//! [`Backend`] — the URL schemes that name it, and how to open a store that already exists. Adding
//! one touches, outside its folder: its `mod` and `pub use` lines in `store/mod.rs`, its line in
//! [`open_existing`]'s list below, and its cargo feature (in this crate, the facade, the command).
//!
//! A URL's password never appears in an [`OpenError`]: services log these.
// A build with no backend uses none of the backends' helpers, nor the list's macro.
#![cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "mysql",
        feature = "redis"
    )),
    allow(dead_code, unused_macros, unused_mut)
)]

use std::future::Future;
use std::sync::Arc;

use super::Store;

/// Why [`open_existing`] opened no store. Nothing was created or changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The URL names no backend this build has.
    #[error(
        "{url:?} is not a store URL this build opens (it opens {}; the other backends need their cargo feature: sqlite, postgres, mysql, redis)",
        if known.is_empty() { "none".to_owned() } else { known.join(" ") }
    )]
    UnknownScheme {
        /// The URL as given, its password hidden.
        url: String,
        /// The schemes this build opens, each as a URL starts with it (`postgres://`).
        known: Vec<&'static str>,
    },
    /// The file the URL names does not exist (SQLite): a typo must not create an empty store.
    #[error("no {backend} store at {location}")]
    Missing {
        /// The backend (`SQLite`).
        backend: &'static str,
        /// Where it looked.
        location: String,
    },
    /// The database holds none of samekey's tables: never used as a samekey store, or another
    /// database. They are not created.
    #[error("{url} holds no samekey tables: it was never used as a samekey store (or names another database); they are not created when opening an existing store")]
    NeverMigrated {
        /// The URL as given, its password hidden.
        url: String,
    },
    /// The server could not be reached, refused the connection or its credentials, or failed to
    /// bring the schema up to date.
    #[error("cannot open the store {url}: {reason}")]
    Unreachable {
        /// The URL as given, its password hidden.
        url: String,
        /// What the driver said.
        reason: String,
    },
}

impl OpenError {
    pub(crate) fn unreachable(url: &str, reason: impl std::fmt::Display) -> OpenError {
        OpenError::Unreachable {
            url: without_password(url),
            reason: reason.to_string(),
        }
    }

    pub(crate) fn never_migrated(url: &str) -> OpenError {
        OpenError::NeverMigrated {
            url: without_password(url),
        }
    }
}

/// `url` with the password of its `user:password@` part (of each node's, for a list) written `***`.
pub(crate) fn without_password(url: &str) -> String {
    url.split(',')
        .map(|node| {
            let Some(scheme_end) = node.find("://").map(|at| at + 3) else {
                return node.to_owned();
            };
            let rest = &node[scheme_end..];
            let authority = rest.find(['/', '?', '#']).map_or(rest, |end| &rest[..end]);
            let Some(at) = authority.rfind('@') else {
                return node.to_owned();
            };
            match authority[..at].find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &node[..scheme_end],
                    &authority[..colon],
                    &node[scheme_end + at..]
                ),
                None => node.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// What [`open_existing`] passes on to the backend beyond the URL.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OpenOptions {
    /// The prefix of every key a store that shares its keyspace writes (Redis: `samekey`, as
    /// `RedisStore::connect`).
    pub key_prefix: String,
}

impl Default for OpenOptions {
    fn default() -> OpenOptions {
        OpenOptions {
            key_prefix: "samekey".to_owned(),
        }
    }
}

impl OpenOptions {
    /// Another key prefix (several applications on one Redis).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> OpenOptions {
        self.key_prefix = prefix.into();
        self
    }
}

/// A backend's part in [`open_existing`]: the URL schemes that name it, and how it opens a store that
/// already exists. Implemented in the backend's own folder.
pub(crate) trait Backend {
    /// How a URL of this backend starts (`postgres://`, `sqlite:`).
    const SCHEMES: &'static [&'static str];

    /// Opens the existing store at `url`, bringing an older schema up to date as a service of this
    /// version does when it starts; never creates one.
    fn open_existing(
        url: &str,
        options: &OpenOptions,
    ) -> impl Future<Output = Result<Arc<dyn Store>, OpenError>> + Send;
}

/// Opens the existing store `url` names: an SQLite file (`sqlite:PATH`), a PostgreSQL
/// (`postgres://`, `postgresql://`) or MySQL (`mysql://`, `mariadb://`) database, a Redis server
/// (`redis://`, `rediss://`; several nodes of a cluster separated by commas), as this build's
/// features have them.
///
/// A file or database without samekey's tables is an error ([`OpenError::NeverMigrated`],
/// [`OpenError::Missing`]), never a new empty store: a typo must not look like a store with no
/// calls. An older schema is brought up to date. A Redis server's durability settings are not
/// checked (an operator's tool reads what is there).
pub async fn open_existing(url: &str, options: &OpenOptions) -> Result<Arc<dyn Store>, OpenError> {
    let mut known: Vec<&'static str> = Vec::new();
    macro_rules! backend {
        ($store:ty) => {
            if <$store as Backend>::SCHEMES
                .iter()
                .any(|scheme| url.starts_with(scheme))
            {
                return <$store as Backend>::open_existing(url, options).await;
            }
            known.extend(<$store as Backend>::SCHEMES);
        };
    }
    // The list: one line per backend.
    #[cfg(feature = "sqlite")]
    backend!(super::SqliteStore);
    #[cfg(feature = "postgres")]
    backend!(super::PgStore);
    #[cfg(feature = "mysql")]
    backend!(super::MySqlStore);
    #[cfg(feature = "redis")]
    backend!(super::RedisStore);
    let _ = options;
    Err(OpenError::UnknownScheme {
        url: without_password(url),
        known,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_url_of_no_backend_names_the_ones_this_build_opens() {
        let err = open_existing("ftp://example/db", &OpenOptions::default())
            .await
            .err()
            .expect("not a store URL");
        let OpenError::UnknownScheme { url, known } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(url, "ftp://example/db");
        #[cfg(feature = "postgres")]
        assert!(known.contains(&"postgres://"), "{known:?}");
        #[cfg(not(any(
            feature = "sqlite",
            feature = "postgres",
            feature = "mysql",
            feature = "redis"
        )))]
        assert!(known.is_empty());
        let _ = known;
        assert!(err.to_string().contains("cargo feature"), "{err}");
    }

    #[test]
    fn a_password_never_reaches_an_error() {
        for (url, shown) in [
            (
                "postgres://app:s3cret@db:5432/orders",
                "postgres://app:***@db:5432/orders",
            ),
            (
                "mysql://app:p@ss@db/orders?ssl-mode=required",
                "mysql://app:***@db/orders?ssl-mode=required",
            ),
            (
                "redis://:pw@a:6379,redis://:pw@b:6379",
                "redis://:***@a:6379,redis://:***@b:6379",
            ),
            ("postgres://app@db/orders", "postgres://app@db/orders"),
            ("sqlite:/var/lib/a@b:c.db", "sqlite:/var/lib/a@b:c.db"),
        ] {
            assert_eq!(without_password(url), shown);
            assert!(!OpenError::unreachable(url, "refused")
                .to_string()
                .contains("s3cret"));
        }
        let err = OpenError::never_migrated("postgres://app:s3cret@db/x");
        assert!(!format!("{err} {err:?}").contains("s3cret"), "{err:?}");
    }
}
