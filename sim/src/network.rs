//! The network between a client and the node that serves its request, shared by the HTTP and gRPC
//! wires: a request leaves its node (waiting while the node is paused), is lost now and then, else
//! travels 5–40 ms to a node drawn at random, which serves it even if the client gives up; the reply
//! is lost now and then, or comes late (2.5–15 s, past the callers' timeouts).

use std::future::Future;
use std::sync::Arc;

use crate::coverage::{Fault, Surface};
use crate::payments::Payments;
use crate::store::Life;
use crate::world::{Served, World};

/// Carries a request from the node `from` to a node of the service, which serves it with `serve`
/// (`what` names the work while it is in flight), and its reply back. Never answers when the
/// request or the reply is lost (the caller's timeout ends the wait).
pub async fn carry<T, F, Fut>(
    world: &Arc<World>,
    from: &Life,
    what: &'static str,
    serve: F,
) -> Served<T>
where
    T: Send + 'static,
    F: FnOnce(Arc<Payments>) -> Fut + Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
{
    let shared = &world.shared;
    from.io().await;
    shared.draws.shuffle().await;
    let fault = if shared.draws.fault(20) {
        shared.draws.keep(
            Some(match shared.draws.below(3) {
                0 => Fault::RequestLost,
                1 => Fault::ReplyLost,
                _ => Fault::ReplyLate,
            }),
            Surface::Wire,
        )
    } else {
        None
    };
    if let Some(fault) = fault {
        shared.cover(fault, Surface::Wire);
    }
    if fault == Some(Fault::RequestLost) {
        return std::future::pending().await;
    }
    tokio::time::sleep(shared.draws.ms(5, 40)).await;
    let node = shared.draws.below(world.nodes.len() as u64) as usize;
    let back = if fault == Some(Fault::ReplyLate) {
        shared.draws.ms(2_500, 15_000)
    } else {
        shared.draws.ms(5, 40)
    };
    // The request is on the network: it is served even if the client gives up.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let server = Arc::clone(world);
    tokio::spawn(async move {
        let served = server.nodes[node].serve(what, serve).await;
        tokio::time::sleep(back).await;
        if fault != Some(Fault::ReplyLost) {
            let _ = tx.send(served);
        }
    });
    let served = match rx.await {
        Ok(served) => served,
        Err(_) => std::future::pending().await,
    };
    from.answered().await;
    served
}
