//! Stage 1: the arguments of `#[idempotent(...)]`, parsed by hand.
//!
//! This stage only checks the *form* of each value (a string where a string goes, an integer for
//! `retries`, …) and keeps every value with its span. What the values mean is checked later, in
//! `validate`: `key` for `key`/`verify`, `validate/policy.rs` for the rest. Problems that do not stop the parse
//! (an unknown or duplicated argument, a value of the wrong kind) are collected in
//! [`Args::errors`] so that the user sees all of them at once.

use proc_macro2::Span;
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, ExprUnary, Ident, Lit, LitStr, Token, UnOp};

use crate::diagnostics::{closest, Errors};

/// Every argument `#[idempotent(...)]` accepts, in the order the docs list them.
pub(crate) const NAMES: &[&str] = &[
    "key",
    "scope",
    "prefix",
    "retries",
    "budget",
    "backoff",
    "jitter",
    "timeout",
    "ttl",
    "window",
    "verify",
    "lookup",
    "on_unknown",
    "runtime",
    "on_busy",
    "on_missing_key",
    "inputs",
];

/// The argument `#[samekey::scoped]` adds to each `#[idempotent]` of its `impl` block: the self type as
/// written, which the default scope then names. Not for users (not listed among the valid arguments).
pub(crate) const IMPL_TYPE: &str = "__samekey_impl_type";

/// A value, the span of its literal, and the tokens it was written as (`-0.1` is two tokens: an
/// error about it should underline both).
#[derive(Clone, Debug)]
pub(crate) struct Value<T> {
    pub(crate) value: T,
    pub(crate) span: Span,
    pub(crate) tokens: proc_macro2::TokenStream,
}

/// `on_unknown = "hold" | "rerun"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnUnknown {
    Hold,
    Rerun,
}

/// `on_busy = "wait" | "reject"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnBusy {
    Wait,
    Reject,
}

/// `on_missing_key = "error" | "run"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnMissingKey {
    Error,
    Run,
}

/// The arguments as written. `None` means "not given"; defaults are applied in `validate/policy.rs`.
#[derive(Default)]
pub(crate) struct Args {
    /// `key = "..."` (a string literal) or `key = a + b.c` (bare): kept as written for `key`.
    pub(crate) key: Option<Expr>,
    pub(crate) verify: Option<Expr>,
    pub(crate) scope: Option<LitStr>,
    pub(crate) prefix: Option<LitStr>,
    pub(crate) retries: Option<Value<u64>>,
    /// `budget = "payments"`: the named dependency whose retry budget the calls draw from.
    pub(crate) budget: Option<LitStr>,
    pub(crate) backoff: Option<LitStr>,
    pub(crate) jitter: Option<Value<f64>>,
    pub(crate) timeout: Option<LitStr>,
    pub(crate) ttl: Option<LitStr>,
    pub(crate) window: Option<LitStr>,
    pub(crate) lookup: Option<Expr>,
    pub(crate) on_unknown: Option<Value<OnUnknown>>,
    pub(crate) runtime: Option<Expr>,
    pub(crate) on_busy: Option<Value<OnBusy>>,
    pub(crate) on_missing_key: Option<Value<OnMissingKey>>,
    /// `inputs = "order_id, amount"`: the parameters a compensation entry keeps.
    pub(crate) inputs: Option<LitStr>,
    /// The self type of the `impl` block, from `#[samekey::scoped]`.
    pub(crate) impl_type: Option<LitStr>,
    /// Problems found while parsing that did not stop it, combined.
    pub(crate) errors: Option<syn::Error>,
    /// Names already seen, to report duplicates.
    seen: Vec<String>,
}

impl Parse for Args {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut args = Args::default();
        let mut errors = Errors::default();
        while !input.is_empty() {
            // `parse_any` so that `type = ...` or `async = ...` is reported as an unknown argument
            // instead of a bare "expected identifier".
            let name = input.call(Ident::parse_any).map_err(|e| {
                syn::Error::new(
                    e.span(),
                    format!(
                        "expected an argument of `#[idempotent(...)]`, such as `key = \"order.id + op\"`; valid arguments: {}",
                        list_names()
                    ),
                )
            })?;
            let name_str = name.unraw().to_string();
            if !input.peek(Token![=]) {
                return Err(syn::Error::new(
                    name.span(),
                    format!(
                        "expected `=` after `{name_str}`: arguments of `#[idempotent(...)]` are written `name = value`, e.g. `{}`",
                        example(&name_str).unwrap_or("key = \"order.id + op\"")
                    ),
                ));
            }
            let eq: Token![=] = input.parse()?;
            if input.is_empty() || input.peek(Token![,]) {
                errors.add(syn::Error::new(
                    eq.span,
                    format!(
                        "`{name_str} =` has no value in `#[idempotent(...)]`{}",
                        example(&name_str)
                            .map(|e| format!(": write e.g. `{e}`"))
                            .unwrap_or_default()
                    ),
                ));
            } else {
                let value: Expr = input.parse()?;
                errors.take(args.set(&name, value));
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        args.errors = errors.into_error();
        Ok(args)
    }
}

impl Args {
    /// Stores one `name = value`, or says why it cannot be stored.
    fn set(&mut self, name: &Ident, value: Expr) -> syn::Result<()> {
        let name_str = name.unraw().to_string();
        if name_str == IMPL_TYPE {
            self.impl_type = Some(string(&name_str, &value)?);
            return Ok(());
        }
        if !NAMES.contains(&name_str.as_str()) {
            let hint = closest(&name_str, NAMES.iter().copied())
                .map(|c| format!("did you mean `{c}`? "))
                .unwrap_or_default();
            return Err(syn::Error::new(
                name.span(),
                format!(
                    "unknown argument `{name_str}` in `#[idempotent(...)]`; {hint}valid arguments: {}",
                    list_names()
                ),
            ));
        }
        if self.seen.contains(&name_str) {
            return Err(syn::Error::new(
                name.span(),
                format!(
                    "`{name_str}` is given twice in `#[idempotent(...)]`: each argument may appear once; remove one"
                ),
            ));
        }
        self.seen.push(name_str.clone());
        match name_str.as_str() {
            "key" => self.key = Some(value),
            "verify" => self.verify = Some(value),
            "lookup" => self.lookup = Some(value),
            "runtime" => self.runtime = Some(value),
            "scope" => self.scope = Some(string(&name_str, &value)?),
            "prefix" => self.prefix = Some(string(&name_str, &value)?),
            "budget" => self.budget = Some(string(&name_str, &value)?),
            "backoff" => self.backoff = Some(string(&name_str, &value)?),
            "timeout" => self.timeout = Some(string(&name_str, &value)?),
            "ttl" => self.ttl = Some(string(&name_str, &value)?),
            "window" => self.window = Some(string(&name_str, &value)?),
            "inputs" => self.inputs = Some(string(&name_str, &value)?),
            "retries" => self.retries = Some(integer(&name_str, &value)?),
            "jitter" => self.jitter = Some(number(&name_str, &value)?),
            "on_unknown" => {
                self.on_unknown = Some(choice(
                    &name_str,
                    &value,
                    &[("hold", OnUnknown::Hold), ("rerun", OnUnknown::Rerun)],
                    "\"hold\" (no retry: the call is marked UNKNOWN and left to compensation) or \
                     \"rerun\" (retry with the same callId, because the remote deduplicates by callId)",
                )?)
            }
            "on_busy" => {
                self.on_busy = Some(choice(
                    &name_str,
                    &value,
                    &[("wait", OnBusy::Wait), ("reject", OnBusy::Reject)],
                    "\"wait\" (wait for the outcome of the call already running) or \
                     \"reject\" (return `samekey::Error::InProgress` at once)",
                )?)
            }
            "on_missing_key" => {
                self.on_missing_key = Some(choice(
                    &name_str,
                    &value,
                    &[("error", OnMissingKey::Error), ("run", OnMissingKey::Run)],
                    "\"error\" (a call whose `Option` key part is `None` fails with \
                     `samekey::Error::MissingKey`; nothing runs) or \"run\" (such a call runs once without \
                     idempotency: no claim, no retry, no receipt)",
                )?)
            }
            _ => {}
        }
        Ok(())
    }
}

fn list_names() -> String {
    NAMES
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// An example of each argument, used in messages.
pub(crate) fn example(name: &str) -> Option<&'static str> {
    Some(match name {
        "key" => "key = \"order.id + op\"",
        "verify" => "verify = \"amount + currency\"",
        "scope" => "scope = \"orders.charge\"",
        "prefix" => "prefix = \"ord\"",
        "retries" => "retries = 3",
        "budget" => "budget = \"payments\"",
        "backoff" => "backoff = \"100ms..10s\"",
        "jitter" => "jitter = 0.2",
        "timeout" => "timeout = \"3s\"",
        "ttl" => "ttl = \"24h\"",
        "window" => "window = \"1d\"",
        "lookup" => "lookup = |call| self.gateway.status(call)",
        "on_unknown" => "on_unknown = \"hold\"",
        "runtime" => "runtime = &self.samekey",
        "on_busy" => "on_busy = \"wait\"",
        "on_missing_key" => "on_missing_key = \"run\"",
        "inputs" => "inputs = \"order_id, amount\"",
        _ => return None,
    })
}

fn wrong_kind(name: &str, value: &Expr, what: &str) -> syn::Error {
    syn::Error::new_spanned(
        value,
        format!(
            "`#[idempotent({name} = ...)]` takes {what}, e.g. `{}`",
            example(name).unwrap_or_default()
        ),
    )
}

fn string(name: &str, value: &Expr) -> syn::Result<LitStr> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Ok(s.clone()),
        _ => Err(wrong_kind(name, value, "a string literal")),
    }
}

/// A literal, possibly negated (`-1`), so that range checks can show the value written.
fn signed_lit(value: &Expr) -> Option<(bool, &Lit)> {
    match value {
        Expr::Lit(ExprLit { lit, attrs }) if attrs.is_empty() => Some((false, lit)),
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_),
            expr,
            attrs,
        }) if attrs.is_empty() => match &**expr {
            Expr::Lit(ExprLit { lit, .. }) => Some((true, lit)),
            _ => None,
        },
        _ => None,
    }
}

fn integer(name: &str, value: &Expr) -> syn::Result<Value<u64>> {
    match signed_lit(value) {
        Some((false, Lit::Int(i))) => match i.base10_parse::<u64>() {
            Ok(v) => Ok(Value {
                value: v,
                span: i.span(),
                tokens: value.to_token_stream(),
            }),
            Err(_) => Err(syn::Error::new(
                i.span(),
                format!("`#[idempotent({name} = {i})]` is not a valid number of retries; use at most 10"),
            )),
        },
        Some((true, Lit::Int(_))) => Err(syn::Error::new_spanned(
            value,
            format!("`#[idempotent({name} = ...)]` cannot be negative: it counts the retries after the first attempt (0 = no retry)"),
        )),
        _ => Err(wrong_kind(name, value, "an integer")),
    }
}

fn number(name: &str, value: &Expr) -> syn::Result<Value<f64>> {
    let parsed = match signed_lit(value) {
        Some((neg, Lit::Float(f))) => f.base10_parse::<f64>().ok().map(|v| (neg, v)),
        Some((neg, Lit::Int(i))) => i.base10_parse::<f64>().ok().map(|v| (neg, v)),
        _ => None,
    };
    match parsed {
        Some((neg, v)) => Ok(Value {
            value: if neg { -v } else { v },
            span: value.span(),
            tokens: value.to_token_stream(),
        }),
        None => Err(wrong_kind(name, value, "a number")),
    }
}

fn choice<T: Copy>(
    name: &str,
    value: &Expr,
    options: &[(&str, T)],
    described: &str,
) -> syn::Result<Value<T>> {
    let lit = string(name, value)?;
    let text = lit.value();
    options
        .iter()
        .find(|(o, _)| *o == text)
        .map(|(_, v)| Value {
            value: *v,
            span: lit.span(),
            tokens: lit.to_token_stream(),
        })
        .ok_or_else(|| {
            syn::Error::new(
                lit.span(),
                format!(
                    "`#[idempotent({name} = {:?})]` is not a valid value: use {described}",
                    text
                ),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> syn::Result<Args> {
        syn::parse_str::<Args>(s)
    }

    fn errors(s: &str) -> String {
        let args = parse(s).unwrap();
        args.errors
            .map(|e| {
                e.into_iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default()
    }

    #[test]
    fn all_arguments() {
        let a = parse(
            r#"key = "order.id + op", scope = "orders.charge", prefix = "ord", retries = 5,
               backoff = "1s..1m", jitter = 0.1, timeout = "3s", ttl = "7d", window = "1d",
               verify = amount + currency, lookup = |call| self.gw.status(call),
               on_unknown = "rerun", runtime = &self.rt, on_busy = "reject",
               on_missing_key = "run","#,
        )
        .unwrap();
        assert!(a.errors.is_none());
        assert!(matches!(a.key, Some(Expr::Lit(_))));
        assert!(matches!(a.verify, Some(Expr::Binary(_))));
        assert_eq!(a.scope.unwrap().value(), "orders.charge");
        assert_eq!(a.prefix.unwrap().value(), "ord");
        assert_eq!(a.retries.unwrap().value, 5);
        assert_eq!(a.backoff.unwrap().value(), "1s..1m");
        assert_eq!(a.jitter.unwrap().value, 0.1);
        assert_eq!(a.timeout.unwrap().value(), "3s");
        assert_eq!(a.ttl.unwrap().value(), "7d");
        assert_eq!(a.window.unwrap().value(), "1d");
        assert!(matches!(a.lookup, Some(Expr::Closure(_))));
        assert_eq!(a.on_unknown.as_ref().unwrap().value, OnUnknown::Rerun);
        assert!(matches!(a.runtime, Some(Expr::Reference(_))));
        assert_eq!(a.on_busy.unwrap().value, OnBusy::Reject);
        assert_eq!(a.on_missing_key.unwrap().value, OnMissingKey::Run);
    }

    #[test]
    fn empty() {
        let a = parse("").unwrap();
        assert!(a.key.is_none() && a.errors.is_none());
    }

    #[test]
    fn unknown_argument_suggests_and_lists() {
        let e = errors(r#"key = "a", retry = 3"#);
        assert!(e.contains("unknown argument `retry`"), "{e}");
        assert!(e.contains("did you mean `retries`?"), "{e}");
        assert!(e.contains("`on_busy`"), "{e}");
        let e = errors(r#"type = 3"#);
        assert!(e.contains("unknown argument `type`"), "{e}");
    }

    #[test]
    fn duplicate_argument() {
        let e = errors(r#"retries = 3, retries = 4"#);
        assert!(e.contains("`retries` is given twice"), "{e}");
    }

    #[test]
    fn collects_several() {
        let e = errors(r#"retries = "3", jitter = "x", timeout = 3, on_busy = "queue", foo = 1"#);
        assert_eq!(e.lines().count(), 5, "{e}");
        assert!(e.contains("takes an integer, e.g. `retries = 3`"), "{e}");
        assert!(e.contains("takes a number, e.g. `jitter = 0.2`"), "{e}");
        assert!(
            e.contains("takes a string literal, e.g. `timeout = \"3s\"`"),
            "{e}"
        );
        assert!(e.contains("use \"wait\""), "{e}");
    }

    #[test]
    fn negative_values() {
        let e = errors("retries = -1");
        assert!(e.contains("cannot be negative"), "{e}");
        let a = parse("jitter = -0.5").unwrap();
        assert_eq!(a.jitter.unwrap().value, -0.5);
        let a = parse("jitter = 0").unwrap();
        assert_eq!(a.jitter.unwrap().value, 0.0);
    }

    #[test]
    fn missing_value_and_equals() {
        let e = errors("key = , retries = 3");
        assert!(e.contains("`key =` has no value"), "{e}");
        let err = parse("retries").err().unwrap().to_string();
        assert!(err.contains("expected `=` after `retries`"), "{err}");
        let err = parse("\"key\" = 1").err().unwrap().to_string();
        assert!(err.contains("expected an argument"), "{err}");
    }

    #[test]
    fn bad_choice() {
        let e = errors(r#"on_unknown = "retry""#);
        assert!(
            e.contains(
                "`#[idempotent(on_unknown = \"retry\")]` is not a valid value: use \"hold\""
            ),
            "{e}"
        );
    }
}
