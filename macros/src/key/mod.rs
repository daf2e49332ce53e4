//! Stage 2a: `key = ...` and `verify = ...`.
//!
//! Both are a list of parts joined with `+`, written as a string (`key = "order.id + op"`) or bare
//! (`key = order.id + op`). A part is a parameter (`order`, `self`), a chain of fields on one
//! (`order.id`, `self.tenant`, `pair.0`), a string literal or an integer literal. Everything else
//! is rejected here, and inputs that are known to change from one call to the next (clocks,
//! randomness, per-call ids, counters, process/thread ids, the attempt number, the callId) get a
//! message of their own, written in [`volatile`]. Whether a field exists and whether a part's type
//! implements `KeyPart` is left to rustc: the expansion routes every part through a spanned
//! `KeyBuilder::named_part` (or `verify_part`) call.
//!
//! In the string form every token carries the span of the whole string (that is all rustc can
//! underline), so each message names the part it is about.

mod volatile;

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::{BinOp, Expr, ExprLit, Ident, Lit, LitStr};

use crate::diagnostics::{closest, Errors};
use crate::display::display;
use crate::signature::Params;
use volatile::{unstable_type, Volatile};

/// One part of a key, ready to be emitted as `KeyBuilder::named_part(&mut builder, &(tokens), name)`
/// (or `verify_part` for `verify`).
pub(crate) struct Part {
    pub(crate) tokens: TokenStream,
    /// Where a type error about this part should point: its first token...
    pub(crate) span: Span,
    /// ...and its last one (the same as `span` in the string form).
    pub(crate) last: Span,
}

/// Parses and checks `key = ...` (or `verify = ...`, as `arg`) against the function's parameters.
pub(crate) fn parts(arg: &str, value: &Expr, params: &Params) -> syn::Result<Vec<Part>> {
    let string_form = match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Some(s),
        _ => None,
    };
    let parsed;
    let (expr, whole) = match string_form {
        Some(lit) => {
            if lit.value().trim().is_empty() {
                return Err(syn::Error::new(
                    lit.span(),
                    format!(
                        "`#[idempotent({arg} = \"\")]` is empty: name the parameters that identify the business operation, e.g. `{}`",
                        crate::args::example(arg).unwrap_or_default()
                    ),
                ));
            }
            parsed = parse_string(arg, lit)?;
            (&parsed, Some(lit.span()))
        }
        None => (value, None),
    };
    let mut flat = Vec::new();
    flatten(expr, &mut flat);
    let mut out = Vec::new();
    let mut errors = Errors::default();
    for part in &flat {
        let span = whole.unwrap_or_else(|| {
            part.to_token_stream()
                .into_iter()
                .next()
                .map_or_else(Span::call_site, |t| t.span())
        });
        match check(arg, part, params) {
            Ok(()) => {
                let tokens = part.to_token_stream();
                let last = match whole {
                    Some(s) => s,
                    None => tokens.clone().into_iter().last().map_or(span, |t| t.span()),
                };
                out.push(Part { tokens, span, last })
            }
            Err(msg) => match whole {
                Some(s) => errors.push(s, msg),
                None => errors.push_spanned(part, msg),
            },
        }
    }
    errors.finish(out)
}

fn parse_string(arg: &str, lit: &LitStr) -> syn::Result<Expr> {
    lit.parse::<Expr>().map_err(|e| {
        syn::Error::new(
            lit.span(),
            format!(
                "`#[idempotent({arg} = {:?})]` cannot be parsed ({e}): write parameters, their fields and string or integer literals joined with `+`, e.g. `{}`",
                lit.value(),
                crate::args::example(arg).unwrap_or_default()
            ),
        )
    })
}

/// Splits `a + b.c + "x"` into its parts. `+` and `-` bind alike and to the left, so
/// `a + b - 1` parses as `(a + b) - 1`: it is re-associated here into `a` and `b - 1`, which is
/// the part the user wrote (and the one the message should name).
fn flatten(expr: &Expr, out: &mut Vec<Expr>) {
    match expr {
        Expr::Binary(b) if b.attrs.is_empty() && matches!(b.op, BinOp::Add(_)) => {
            flatten(&b.left, out);
            flatten(&b.right, out);
        }
        Expr::Binary(b) if b.attrs.is_empty() && is_add(&b.left) => {
            flatten(&b.left, out);
            if let Some(last) = out.pop() {
                out.push(Expr::Binary(syn::ExprBinary {
                    attrs: Vec::new(),
                    left: Box::new(last),
                    op: b.op,
                    right: b.right.clone(),
                }));
            }
        }
        Expr::Group(g) => flatten(&g.expr, out),
        _ => out.push(expr.clone()),
    }
}

fn is_add(expr: &Expr) -> bool {
    matches!(expr, Expr::Binary(b) if b.attrs.is_empty() && matches!(b.op, BinOp::Add(_)))
}

/// Checks one part; the error is the message, spanned by the caller.
fn check(arg: &str, part: &Expr, params: &Params) -> Result<(), String> {
    let text = display(part.to_token_stream());
    let p = &text;
    let volatile = Volatile::find(part);
    match part {
        Expr::Lit(ExprLit { lit, .. }) => match lit {
            Lit::Str(_) | Lit::Int(_) => Ok(()),
            Lit::Float(_) => Err(format!(
                "{arg} part `{p}` is a float literal: floats have no stable key encoding; use a string (\"0.5\") or integer literal"
            )),
            _ => Err(format!(
                "{arg} part `{p}` is not allowed: literals in {arg} parts are strings (\"charge\") or integers (1)"
            )),
        },
        Expr::Path(_) | Expr::Field(_) => {
            if let Some(v) = volatile {
                return Err(v.message(arg, p));
            }
            let Some(root) = root_ident(part) else {
                return Err(format!(
                    "{arg} part `{p}` is a path, not a parameter: a {arg} part is a parameter, a field of one or a literal; for a constant, write its value as a literal (e.g. \"charge\")"
                ));
            };
            let name = root.unraw().to_string();
            if name == "self" && params.receiver {
                return Ok(());
            }
            let Some(param) = params.find(&name) else {
                return Err(unknown_param(arg, p, &name, params));
            };
            if matches!(part, Expr::Path(_)) {
                if let Some(ty) = &param.ty {
                    if let Some(msg) = unstable_type(arg, p, ty) {
                        return Err(msg);
                    }
                }
            }
            Ok(())
        }
        _ => Err(match volatile {
            Some(v) => v.message(arg, p),
            None => not_allowed(arg, p, part),
        }),
    }
}

/// `x` for `x`, `x.a.0`; `None` for anything else (`a::b`, `x::<T>`, `<T>::C`).
fn root_ident(expr: &Expr) -> Option<&Ident> {
    match expr {
        Expr::Path(p)
            if p.qself.is_none()
                && p.path.leading_colon.is_none()
                && p.path.segments.len() == 1
                && p.path.segments[0].arguments.is_none() =>
        {
            Some(&p.path.segments[0].ident)
        }
        Expr::Field(f) => root_ident(&f.base),
        Expr::Group(g) => root_ident(&g.expr),
        _ => None,
    }
}

fn unknown_param(arg: &str, p: &str, name: &str, params: &Params) -> String {
    let names = params.names();
    let fn_name = &params.fn_name;
    if let Some(c) = closest(name, names.iter().map(String::as_str)) {
        return format!("{arg} part `{p}` names no parameter of `{fn_name}`; did you mean `{c}`?");
    }
    let listed = if names.is_empty() {
        format!("`{fn_name}` has no parameters")
    } else {
        format!(
            "the parameters of `{fn_name}` are {}",
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    format!(
        "{arg} part `{p}` names no parameter of `{fn_name}` ({listed}); a {arg} part is a parameter, a field of one (`order.id`) or a string or integer literal"
    )
}

fn not_allowed(arg: &str, p: &str, part: &Expr) -> String {
    let first_bad = match part {
        Expr::Call(_) | Expr::MethodCall(_) => {
            return format!(
                "{arg} part `{p}` is a call: calls are not allowed in {arg} parts: name a parameter or one of its fields"
            )
        }
        Expr::Macro(_) => {
            return format!(
                "{arg} part `{p}` is a macro call: calls are not allowed in {arg} parts: name a parameter or one of its fields"
            )
        }
        Expr::Binary(b) => {
            let op = display(b.op.to_token_stream());
            return format!(
                "{arg} part `{p}` uses the operator `{op}`: parts are only joined with `+`, never computed; name a parameter, one of its fields or a literal"
            );
        }
        Expr::Index(_) => {
            return format!(
                "{arg} part `{p}` indexes: indexing is not allowed in {arg} parts; name a parameter or one of its fields"
            )
        }
        Expr::Reference(r) => {
            return format!(
                "{arg} part `{p}` takes a reference: parts are borrowed already; write `{}`",
                display(r.expr.to_token_stream())
            )
        }
        Expr::Paren(inner) => {
            return format!(
                "{arg} part `{p}` is in parentheses: write `{}`; parts are joined with `+` and never computed",
                display(inner.expr.to_token_stream())
            )
        }
        Expr::Cast(_) => "a cast",
        Expr::Closure(_) => "a closure",
        Expr::Block(_) | Expr::Unsafe(_) | Expr::Async(_) => "a block",
        Expr::Unary(_) => "an operator",
        Expr::Tuple(_) | Expr::Array(_) | Expr::Struct(_) => "a constructed value",
        _ => "not a parameter, field or literal",
    };
    format!(
        "{arg} part `{p}` is {first_bad}: a {arg} part is a parameter (`order`), a field of one (`order.id`, `pair.0`), or a string or integer literal"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signature::tests::{charge, params};

    fn check_str(key: &str) -> Result<Vec<String>, String> {
        let value: Expr = syn::parse_str(key).unwrap();
        parts("key", &value, &charge())
            .map(|ps| ps.into_iter().map(|p| display(p.tokens)).collect())
            .map_err(|e| {
                e.into_iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("\n")
            })
    }

    fn err(key: &str) -> String {
        check_str(key).unwrap_err()
    }

    #[test]
    fn accepted_forms() {
        assert_eq!(
            check_str(r#""order.id + op + \"charge\" + 7""#).unwrap(),
            ["order.id", "op", "\"charge\"", "7"]
        );
        assert_eq!(
            check_str(r#"self.tenant + order.items.0 + a + b + "x""#).unwrap(),
            ["self.tenant", "order.items.0", "a", "b", "\"x\""]
        );
        assert_eq!(check_str("self").unwrap(), ["self"]);
        assert_eq!(check_str("r#op").unwrap(), ["r#op"]);
    }

    #[test]
    fn empty_and_unparsable() {
        assert!(err(r#""""#).contains("`#[idempotent(key = \"\")]` is empty"));
        assert!(err(r#""  ""#).contains("is empty"));
        let e = err(r#""order.id, op""#);
        assert!(e.contains("cannot be parsed"), "{e}");
        assert!(e.contains("joined with `+`"), "{e}");
        assert!(err(r#""order.id +""#).contains("cannot be parsed"));
    }

    #[test]
    fn unknown_parameter() {
        let e = err("ordr.id");
        assert_eq!(
            e,
            "key part `ordr.id` names no parameter of `charge`; did you mean `order`?"
        );
        let e = err(r#""zzz""#.trim_matches('"'));
        assert!(
            e.contains("(the parameters of `charge` are `self`, `order`, `op`"),
            "{e}"
        );
        let p = params("async fn f() -> Result<(), E>");
        let e = parts("key", &syn::parse_str("x").unwrap(), &p)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("`f` has no parameters"), "{e}");
        let p = params("async fn f(x: u32) -> Result<(), E>");
        let e = parts("key", &syn::parse_str("self.id").unwrap(), &p)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("key part `self.id` names no parameter of `f`"),
            "{e}"
        );
    }

    #[test]
    fn volatile_inputs() {
        let cases = [
            ("Utc::now()", "reads the clock"),
            ("\"Utc::now()\"", "reads the clock"),
            ("chrono::Local::now().date_naive()", "reads the clock"),
            ("Instant::now().elapsed().as_secs()", "reads the clock"),
            ("OffsetDateTime::now_utc()", "reads the clock"),
            ("SystemTime::now()", "reads the clock"),
            ("now", "reads the clock"),
            ("rand::random::<u64>()", "is random"),
            ("rand::thread_rng().gen_range(0..9)", "is random"),
            ("fastrand::u64(..)", "is random"),
            ("Uuid::new_v4()", "makes a new id on every call"),
            ("uuid::Uuid::now_v7()", "makes a new id on every call"),
            ("Ulid::new()", "makes a new id on every call"),
            ("nanoid!()", "makes a new id on every call"),
            ("ObjectId::new()", "makes a new id on every call"),
            ("COUNTER.fetch_add(1, Ordering::SeqCst)", "reads a counter"),
            ("self.ids.next_id()", "reads a counter"),
            ("std::process::id()", "is a process or thread id"),
            ("std::thread::current().id()", "is a process or thread id"),
            ("attempt", "is the attempt number"),
            ("samekey::current().attempt()", "is the attempt number"),
            ("samekey::current().call_id()", "is the callId"),
            ("samekey::current()", "is the callId"),
            ("order.call_id", "is the callId"),
            ("call_id", "is the callId"),
        ];
        for (key, expected) in cases {
            let e = err(key);
            assert!(e.contains(expected), "{key}: {e}");
            assert!(e.starts_with("key part `"), "{key}: {e}");
        }
        assert!(err("\"Utc::now()\"").starts_with("key part `Utc::now()` reads the clock"));
        assert!(err("\"order.id + Uuid::new_v4()\"")
            .starts_with("key part `Uuid::new_v4()` makes a new id"));
    }

    #[test]
    fn other_forms_rejected() {
        let cases = [
            (
                "order.id.to_string()",
                "is a call: calls are not allowed in key parts",
            ),
            ("hash(order)", "is a call: calls are not allowed"),
            ("format!(\"{}\", op)", "is a macro call"),
            ("amount - 1", "uses the operator `-`"),
            ("amount * 2", "uses the operator `*`"),
            ("order.items[0]", "indexes"),
            (
                "&order",
                "takes a reference: parts are borrowed already; write `order`",
            ),
            ("(op)", "is in parentheses"),
            ("amount as u64", "is a cast"),
            ("|x| x", "is a closure"),
            ("1.5", "is a float literal"),
            ("true", "literals in key parts are strings"),
            ("Self::OP", "is a path, not a parameter"),
            ("consts::OP", "is a path, not a parameter"),
            ("-amount", "is an operator"),
        ];
        for (key, expected) in cases {
            let e = err(key);
            assert!(e.contains(expected), "{key}: {e}");
        }
    }

    #[test]
    fn unstable_parameter_types() {
        let cases = [
            ("price", "has type `f64`: floats are not stable key parts"),
            ("seen", "has type `Vec<Option<f32>>`, which holds a `f32`"),
            ("tags", "has type `HashMap<String, u32>`: a hash collection"),
            ("ids", "has type `&FxHashSet<u64>`: a hash collection"),
            ("at", "has type `std::time::Instant`, a clock reading"),
            ("call", "is the callId"),
        ];
        for (key, expected) in cases {
            let e = err(key);
            assert!(e.contains(expected), "{key}: {e}");
        }
    }

    #[test]
    fn collects_every_bad_part() {
        let e = err("ordr + Utc::now() + op + amount - 1");
        assert_eq!(e.lines().count(), 3, "{e}");
    }

    #[test]
    fn verify_messages_name_verify() {
        let value: Expr = syn::parse_str("rand::random()").unwrap();
        let e = parts("verify", &value, &charge())
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.starts_with("verify part `rand::random()` is random"),
            "{e}"
        );
        assert!(e.contains("reuse of the key"), "{e}");
    }
}
