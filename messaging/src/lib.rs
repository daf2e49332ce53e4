//! samekey for messages: the identity of a logical call carried in a message, and a consumer that
//! does a redelivered message's work once.
//!
//! The incident this crate is built against (`docs/rules.md`, *Field lessons*): a tool call went over a message
//! queue with its callId in the body only; the consumer failed, the broker redelivered, the body had
//! been re-serialized on the way and the callId was lost — the duplicate could not be recognised. So
//! a samekey message carries its ids **in the broker's attributes and in the body**:
//!
//! * [`Envelope`]: the callId, its message number (`seq`), the traceId and `traceparent` in the body
//!   (JSON) and, through [`Envelope::attributes`] and [`Envelope::to_message`], in the broker's
//!   headers and message id.
//! * [`Inbox`]: a consumer's inbox — a message's work runs at most once per message identity, through
//!   the runtime's store; [`Inbox::handle`] reads a broker's [`Delivery`] (an envelope, a body whose
//!   ids are in the headers, or a foreign producer's message known by its message id) and says what
//!   to tell the broker ([`Disposition`]: ack once the outcome is recorded, requeue, dead-letter).
//! * [`Publish`] and [`Confirms`]: a publish ends when the broker confirmed it; one whose
//!   confirmation never came is [`PublishError::Unconfirmed`] — an unknown outcome — and is
//!   published again under the same id, never a new one.
//!
//! ```
//! use samekey_messaging::{Envelope, Inbox};
//!
//! # #[derive(Debug, thiserror::Error)] #[error("x")] struct ShipError(#[from] samekey::Error);
//! # impl samekey::Classify for ShipError { fn classify(&self) -> samekey::ErrorClass { self.0.classify() } }
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let message = Envelope::new("order-7".to_owned()); // inside an #[idempotent] call: its ids
//! let inbox = Inbox::new("shipping.on_charged");
//! let shipped: Result<String, ShipError> = inbox
//!     .deliver(message.clone(), |order| async move { Ok(format!("shipped {order}")) })
//!     .await;
//! // The broker redelivers: answered from the receipt, the handler does not run again.
//! let again: Result<String, ShipError> = inbox
//!     .deliver(message, |_| async move { unreachable!("worked once") })
//!     .await;
//! assert_eq!(shipped.unwrap(), again.unwrap());
//! # });
//! ```

#![warn(missing_docs)]

#[cfg(feature = "rabbitmq")]
pub mod amqp;
mod delivery;
mod envelope;
mod inbox;
mod message;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub mod outbox;

pub use delivery::{Delivery, Disposition, Handled, HEADER_DEAD_LETTER_REASON};
pub use envelope::{
    AttributeError, Envelope, ATTR_CALL_ID, ATTR_MESSAGE_SEQ, ATTR_TRACEPARENT, ATTR_TRACE_ID,
};
pub use inbox::{Inbox, MAX_DELIVERIES};
pub use message::{Confirms, Message, Publish, PublishError};
/// What [`Inbox::on_unknown`] takes: the at-most-once core's own setting.
pub use samekey_runtime::at_most_once::OnUnknown;
