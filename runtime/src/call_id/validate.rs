//! What the text of a callId's fields may hold: the rules for a callId prefix ([`validate_label`]) and
//! a node name ([`validate_node`]), and [`ParseCallIdError`], which names the field, the text and the
//! rule it broke, for those and for whole callIds and traceIds.

use std::fmt;

/// Longest accepted callId prefix, in bytes.
pub const MAX_LABEL_LEN: usize = 32;
/// Longest accepted node name, in bytes: a DNS label's length, so that a host or pod name fits.
pub const MAX_NODE_LEN: usize = 63;

/// Checks that `s` can be a callId prefix: 1 to 32 bytes of ASCII letters, digits, `_`
/// or `.` (no `-`, which ends the prefix).
pub fn validate_label(s: &str) -> Result<(), ParseCallIdError> {
    validate(
        Field::Prefix,
        s,
        MAX_LABEL_LEN,
        b"_.",
        [
            "a callId prefix must be 1 to 32 characters long",
            "a callId prefix may only hold ASCII letters, digits, `_` and `.`",
        ],
    )
}

/// Checks that `s` can be a node name, the callId's last field: 1 to 63 bytes of ASCII
/// letters, digits, `_`, `.` or `-`, so that host and pod names (`api-7`, `orders-5d9f-x2x9k`,
/// `web.eu-1`) are node names as they are.
pub fn validate_node(s: &str) -> Result<(), ParseCallIdError> {
    validate(
        Field::Node,
        s,
        MAX_NODE_LEN,
        b"_.-",
        [
            "a node name must be 1 to 63 characters long",
            "a node name may only hold ASCII letters, digits, `_`, `.` and `-`",
        ],
    )
}

/// `s` is 1 to `max` bytes of ASCII letters, digits and `extra`; else the first or the second reason.
fn validate(
    field: Field,
    s: &str,
    max: usize,
    extra: &[u8],
    [length, chars]: [&'static str; 2],
) -> Result<(), ParseCallIdError> {
    if s.is_empty() || s.len() > max {
        return Err(ParseCallIdError::new(field, s, length));
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
    {
        return Err(ParseCallIdError::new(field, s, chars));
    }
    Ok(())
}

/// Why a text is not a valid [`CallId`](super::CallId), callId prefix or node name. Its message names
/// which one, the text, and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field} `{input}`: {reason}")]
pub struct ParseCallIdError {
    field: Field,
    input: String,
    reason: &'static str,
}

/// What [`ParseCallIdError`] was parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Field {
    CallId,
    Prefix,
    Node,
    TraceId,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::CallId => "callId",
            Field::Prefix => "callId prefix",
            Field::Node => "node name (`Runtime::builder().node(...)`)",
            Field::TraceId => "traceId",
        })
    }
}

impl ParseCallIdError {
    pub(super) fn new(field: Field, input: &str, reason: &'static str) -> ParseCallIdError {
        ParseCallIdError {
            field,
            input: input.to_owned(),
            reason,
        }
    }

    /// A field's error, reported for the whole callId it is part of.
    pub(super) fn within(mut self, whole: &str) -> ParseCallIdError {
        self.field = Field::CallId;
        self.input = whole.to_owned();
        self
    }

    /// The text that was refused.
    pub fn input(&self) -> &str {
        &self.input
    }

    /// What is wrong with it.
    pub fn reason(&self) -> &str {
        self.reason
    }
}
