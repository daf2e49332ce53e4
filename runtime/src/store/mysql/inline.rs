//! A statement's `?` filled with literals, for the one batch a claim sends (MySQL's prepared
//! statements run one statement each; a text batch runs several in one round trip).
//!
//! # Guarantees
//!
//! * **Nothing a caller gives reaches the SQL as text.** Bytes and strings become hexadecimal
//!   literals (`X'…'`, a string `CONVERT(X'…' USING utf8mb4)`), integers decimal digits: the filled
//!   statement holds only the file's own text, hexadecimal digits, decimal digits and `NULL`, whatever
//!   the values, the server's `sql_mode` or the connection's character set.
//! * **A statement gets exactly its values**: one literal per `?`, or an error.

use std::fmt::Write as _;

use crate::error::StoreError;

/// A value of a batch, written as a literal.
pub(super) enum Literal<'a> {
    /// `X'…'`.
    Bytes(&'a [u8]),
    /// `CONVERT(X'…' USING utf8mb4)`: the string's UTF-8 bytes.
    Text(&'a str),
    /// Decimal digits.
    Int(i64),
    /// `NULL`.
    Null,
}

impl Literal<'_> {
    fn write(&self, out: &mut String) {
        let hex = |out: &mut String, bytes: &[u8]| {
            out.push_str("X'");
            for b in bytes {
                // Writing to a String cannot fail.
                let _ = write!(out, "{b:02x}");
            }
            out.push('\'');
        };
        match self {
            Literal::Bytes(bytes) => hex(out, bytes),
            Literal::Text(text) => {
                out.push_str("CONVERT(");
                hex(out, text.as_bytes());
                out.push_str(" USING utf8mb4)");
            }
            Literal::Int(v) => {
                let _ = write!(out, "{v}");
            }
            Literal::Null => out.push_str("NULL"),
        }
    }
}

/// `statement` without its comment lines, each `?` replaced by the next of `values`.
pub(super) fn inline(statement: &str, values: &[Literal<'_>]) -> Result<String, StoreError> {
    let mut out = String::with_capacity(statement.len() + 160);
    let mut next = values.iter();
    for line in statement.lines() {
        if line.trim_start().starts_with("--") {
            continue;
        }
        for c in line.chars() {
            if c == '?' {
                let value = next.next().ok_or_else(|| {
                    StoreError::Unavailable("a batch statement has more ? than values".into())
                })?;
                value.write(&mut out);
            } else {
                out.push(c);
            }
        }
        out.push('\n');
    }
    if next.next().is_some() {
        return Err(StoreError::Unavailable(
            "a batch statement has fewer ? than values".into(),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{inline, Literal};

    #[test]
    fn values_become_hex_and_digits_only() {
        let sql = "-- ? a comment's ? are not placeholders\nSELECT ?, ?, ?, ?";
        let filled = inline(
            sql,
            &[
                Literal::Bytes(&[0, 0xab]),
                Literal::Text("a'; DROP TABLE x; --"),
                Literal::Int(-7),
                Literal::Null,
            ],
        )
        .unwrap();
        assert_eq!(
            filled,
            "SELECT X'00ab', CONVERT(X'61273b2044524f50205441424c4520783b202d2d' USING utf8mb4), -7, NULL\n"
        );
    }

    #[test]
    fn a_statement_gets_exactly_its_values() {
        assert!(inline("SELECT ?", &[]).is_err());
        assert!(inline("SELECT 1", &[Literal::Int(1)]).is_err());
    }
}
