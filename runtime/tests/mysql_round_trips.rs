//! MySQL or MariaDB: the round trips a call costs, counted on the wire. The store connects through a
//! proxy of this test's own that counts the commands its clients send (a MySQL command is a packet of
//! sequence number 0; a text batch of several statements is one), except the ping sqlx sends on a
//! connection given back to the pool, after the call has its answer. Needs `SAMEKEY_MYSQL_URL`; without
//! it the test prints that it was skipped.
#![cfg(feature = "mysql")]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use samekey_runtime::at_most_once::AtMostOnce;
use samekey_runtime::store::MySqlStore;
use samekey_runtime::Runtime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

static OP: AtMostOnce = AtMostOnce::new("mysql_round_trips.op");

/// The command byte of a ping.
const COM_PING: u8 = 0x0e;

/// Forwards the client's packets to the server, counting the commands (sequence number 0).
async fn forward_counting(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    commands: Arc<AtomicU64>,
) -> std::io::Result<()> {
    let mut header = [0u8; 4];
    loop {
        from.read_exact(&mut header).await?;
        let len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
        let mut payload = vec![0u8; len];
        from.read_exact(&mut payload).await?;
        // Not the pings sqlx sends as a connection goes back to the pool, after the answer.
        if header[3] == 0 && payload.first() != Some(&COM_PING) {
            commands.fetch_add(1, Ordering::SeqCst);
        }

        to.write_all(&header).await?;
        to.write_all(&payload).await?;
    }
}

/// A proxy to `server` (`host:port`); answers its own address.
async fn counting_proxy(server: String, commands: Arc<AtomicU64>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(upstream) = TcpStream::connect(&server).await else {
                continue;
            };
            let (client_read, mut client_write) = client.into_split();
            let (mut upstream_read, upstream_write) = upstream.into_split();
            tokio::spawn(forward_counting(
                client_read,
                upstream_write,
                commands.clone(),
            ));
            tokio::spawn(
                async move { tokio::io::copy(&mut upstream_read, &mut client_write).await },
            );
        }
    });
    address
}

async fn call(rt: &Runtime, key: &str) {
    let out: Result<u64, std::io::Error> = OP.key(key).runtime(rt).run(|| async { Ok(1) }).await;
    assert_eq!(out.ok(), Some(1));
}

/// A fresh call costs two round trips (claim, complete), a replay one (the claim's batch answers the
/// record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_call_costs_two_round_trips_and_a_replay_one() {
    let Ok(url) = std::env::var("SAMEKEY_MYSQL_URL") else {
        samekey_runtime::conformance::skipped(
            "set SAMEKEY_MYSQL_URL (scripts/services start) to run the MySQL tests",
        );
        return;
    };
    // mysql://user:password@host:port/db: the proxy in place of host:port, without TLS (the proxy
    // reads the packets).
    let (head, rest) = url.rsplit_once('@').expect("a user in the URL");
    let (server, db) = rest.split_once('/').expect("a database in the URL");
    let commands = Arc::new(AtomicU64::new(0));
    let proxy = counting_proxy(server.to_owned(), commands.clone()).await;
    let separator = if db.contains('?') { '&' } else { '?' };
    let proxied = format!("{head}@{proxy}/{db}{separator}ssl-mode=disabled");
    let store = MySqlStore::connect(&proxied).await.expect("connect");
    let rt = Runtime::builder().store(store).build().unwrap();
    let run = format!("{:x}", samekey_runtime::TraceId::new().as_u128());
    // The pool's connection and its statement cache, warmed.
    call(&rt, &format!("{run}-warm")).await;
    call(&rt, &format!("{run}-warm")).await;
    let (mut fresh, mut replay) = (u64::MAX, u64::MAX);
    for round in 0..5 {
        let key = format!("{run}-{round}");
        let before = commands.load(Ordering::SeqCst);
        call(&rt, &key).await;
        let between = commands.load(Ordering::SeqCst);
        call(&rt, &key).await;
        let after = commands.load(Ordering::SeqCst);
        fresh = fresh.min(between - before);
        replay = replay.min(after - between);
    }
    println!("a fresh call: {fresh} round trips; a replay: {replay}");
    assert_eq!((fresh, replay), (2, 1));
}
