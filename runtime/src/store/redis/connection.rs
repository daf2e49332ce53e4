//! How a [`RedisStore`] reaches Redis: one server (reconnecting) or a Redis Cluster (each command
//! routed to its slot's node); the check that every primary keeps what it acknowledges (see
//! [Durability](RedisStore#durability)); and the scans that visit every primary.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::RedisFuture;

use super::scripts::Scripts;
use super::{corrupt, unavailable, RedisStore, DEFAULT_INDEX_TTL};
use crate::error::StoreError;

/// One server (reconnecting), or a Redis Cluster (routing each command to its slot's node).
#[derive(Clone)]
pub(super) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, redis::Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

impl RedisStore {
    /// Connects to `url` (`redis://host:port/`) with a reconnecting connection, keys prefixed
    /// `samekey`.
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        RedisStore::connect_with_prefix(url, "samekey").await
    }

    /// Connects with another key prefix (several applications on one Redis), and checks that the server
    /// keeps what it acknowledges (see [Durability](RedisStore#durability)).
    pub async fn connect_with_prefix(url: &str, prefix: &str) -> Result<RedisStore, StoreError> {
        let store = RedisStore::connect_unverified(url, prefix).await?;
        store.verify_durable().await?;
        Ok(store)
    }

    /// Connects without checking the server's durability settings: for the cache of a
    /// [`CachedStore`](super::CachedStore), or a server whose durability you vouch for (a managed
    /// service that hides `CONFIG`, say).
    pub async fn connect_unverified(url: &str, prefix: &str) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(url)
            .map_err(|e| StoreError::Unavailable(format!("invalid Redis URL `{url}`: {e}")))?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(1);
        let conn = ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(unavailable)?;
        let mut store = RedisStore::on(Connection::Single(conn), prefix);
        store.client = Some(client);
        Ok(store)
    }

    /// Connects to a Redis Cluster through any of its nodes (`redis://host:port/` each), keys prefixed
    /// `samekey`; commands go to the node that serves their key's slot.
    pub async fn connect_cluster(nodes: &[&str]) -> Result<RedisStore, StoreError> {
        RedisStore::connect_cluster_with_prefix(nodes, "samekey").await
    }

    /// Connects to a Redis Cluster with another key prefix, and checks that every primary keeps what it
    /// acknowledges.
    pub async fn connect_cluster_with_prefix(
        nodes: &[&str],
        prefix: &str,
    ) -> Result<RedisStore, StoreError> {
        let store = RedisStore::connect_cluster_unverified(nodes, prefix).await?;
        store.verify_durable().await?;
        Ok(store)
    }

    /// Connects to a Redis Cluster without checking its durability settings (see
    /// [`RedisStore::connect_unverified`]).
    pub async fn connect_cluster_unverified(
        nodes: &[&str],
        prefix: &str,
    ) -> Result<RedisStore, StoreError> {
        let client = redis::cluster::ClusterClientBuilder::new(nodes.to_vec())
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| StoreError::Unavailable(format!("invalid Redis Cluster nodes: {e}")))?;
        let conn = client.get_async_connection().await.map_err(unavailable)?;
        Ok(RedisStore::on(Connection::Cluster(conn), prefix))
    }

    fn on(conn: Connection, prefix: &str) -> RedisStore {
        RedisStore {
            conn,
            client: None,
            prefix: prefix.to_owned(),
            index_ttl: DEFAULT_INDEX_TTL,
            unindexed: Arc::default(),
            scripts: Scripts::new(),
        }
    }

    /// How long the callId index keeps an entry (default 8 days).
    pub fn with_index_ttl(mut self, ttl: Duration) -> RedisStore {
        self.index_ttl = ttl;
        self
    }

    /// Checks, on every primary, the settings that decide whether Redis may lose an acknowledged claim:
    /// `maxmemory-policy` must be `noeviction` and `appendonly` must be `yes`. A server that cannot be
    /// asked (`CONFIG` disabled or renamed) is refused too: use [`RedisStore::connect_unverified`] for
    /// one whose durability you know.
    pub async fn verify_durable(&self) -> Result<(), StoreError> {
        for node in self.primaries().await? {
            let where_ = match &node {
                Some(SingleNodeRoutingInfo::ByAddress { host, port }) => {
                    format!(" on {host}:{port}")
                }
                _ => String::new(),
            };
            let setting = |name: &'static str| {
                let node = node.clone();
                let mut conn = self.conn();
                async move {
                    let get = redis::cmd("CONFIG").arg("GET").arg(name).clone();
                    let answer: redis::RedisResult<Vec<String>> = match (&node, &mut conn) {
                        (Some(route), Connection::Cluster(c)) => c
                            .route_command(get, RoutingInfo::SingleNode(route.clone()))
                            .await
                            .and_then(|v| redis::from_redis_value(v).map_err(Into::into)),
                        (_, conn) => get.query_async(conn).await,
                    };
                    match answer {
                        Ok(pair) => pair
                            .get(1)
                            .cloned()
                            .ok_or_else(|| format!("`CONFIG GET {name}` answered nothing")),
                        Err(e) => Err(format!("`CONFIG GET {name}` failed ({e})")),
                    }
                }
            };
            let problems: Vec<String> = match (
                setting("maxmemory-policy").await,
                setting("appendonly").await,
            ) {
                (Ok(policy), Ok(aof)) => {
                    let mut problems = Vec::new();
                    if policy != "noeviction" {
                        problems.push(format!("maxmemory-policy is `{policy}`, so Redis may evict a claim and free its key (set `noeviction`)"));
                    }
                    if aof != "yes" {
                        problems.push(format!("appendonly is `{aof}`, so a restart loses the claims since the last snapshot (set `appendonly yes`, `appendfsync always`)"));
                    }
                    problems
                }
                (Err(e), _) | (_, Err(e)) => {
                    vec![format!("its durability settings cannot be read: {e}")]
                }
            };
            if !problems.is_empty() {
                return Err(StoreError::NotDurable(format!(
                    "Redis{where_} is not safe as the store of record: {}; a forgotten claim is a call that runs twice. Use RedisStore::connect_unverified for a cache, or for a server whose durability you vouch for",
                    problems.join("; ")
                )));
            }
        }
        Ok(())
    }

    /// The nodes a full scan must visit: the one server, or every primary of a cluster (from
    /// `CLUSTER NODES`).
    async fn primaries(&self) -> Result<Vec<Option<SingleNodeRoutingInfo>>, StoreError> {
        let Connection::Cluster(mut c) = self.conn() else {
            return Ok(vec![None]);
        };
        let answer = c
            .route_command(
                redis::cmd("CLUSTER").arg("NODES").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await
            .map_err(unavailable)?;
        let text: String = redis::from_redis_value(answer).map_err(corrupt)?;
        let mut nodes = Vec::new();
        for line in text.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(address), Some(flags)) = (fields.get(1), fields.get(2)) else {
                continue;
            };
            if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
                continue;
            }
            // `host:port@cport`
            let host_port = address.split('@').next().unwrap_or(address);
            let Some((host, port)) = host_port.rsplit_once(':') else {
                continue;
            };
            let Ok(port) = port.parse::<u16>() else {
                continue;
            };
            nodes.push(Some(SingleNodeRoutingInfo::ByAddress {
                host: host.to_owned(),
                port,
            }));
        }
        if nodes.is_empty() {
            return Err(corrupt("CLUSTER NODES lists no primary"));
        }
        Ok(nodes)
    }

    /// The names of every key `pattern` matches, from every primary (`SCAN`, in batches), sorted.
    pub(super) async fn names(&self, pattern: &str) -> Result<Vec<String>, StoreError> {
        let mut names = Vec::new();
        for node in self.primaries().await? {
            let mut cursor: u64 = 0;
            loop {
                let scan = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1_000)
                    .clone();
                let (next, batch): (u64, Vec<String>) = match (&node, self.conn()) {
                    (Some(route), Connection::Cluster(mut c)) => {
                        let answer = c
                            .route_command(scan.clone(), RoutingInfo::SingleNode(route.clone()))
                            .await
                            .map_err(unavailable)?;
                        redis::from_redis_value(answer).map_err(corrupt)?
                    }
                    (_, mut conn) => scan.query_async(&mut conn).await.map_err(unavailable)?,
                };
                names.extend(batch);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        // `SCAN` may return a key more than once.
        names.sort_unstable();
        names.dedup();
        Ok(names)
    }
}

/// `redis://` (or `rediss://`; a cluster's nodes separated by commas), keys under the options'
/// prefix. The server's durability settings are not checked: an operator's tool reads what is there.
impl crate::store::Backend for RedisStore {
    const SCHEMES: &'static [&'static str] = &["redis://", "rediss://"];

    async fn open_existing(
        url: &str,
        options: &crate::store::OpenOptions,
    ) -> Result<std::sync::Arc<dyn crate::store::Store>, crate::store::OpenError> {
        let nodes: Vec<&str> = url.split(',').map(str::trim).collect();
        let store = if nodes.len() > 1 {
            RedisStore::connect_cluster_unverified(&nodes, &options.key_prefix).await
        } else {
            RedisStore::connect_unverified(url, &options.key_prefix).await
        };
        let store = store.map_err(|e| crate::store::OpenError::unreachable(url, e))?;
        Ok(std::sync::Arc::new(store))
    }
}
