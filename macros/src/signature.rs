//! The function `#[idempotent]` goes on: its parts as written, the checks of its signature, and its
//! parameters.
//!
//! Guarantees:
//! - The item is parsed only as far as the expansion needs it: attributes, visibility and signature
//!   with `syn`, the body kept as tokens ([`Func`]), so the function is re-emitted exactly as written.
//! - Group 1 of the compile-time checks (`docs/compile_errors.md`) is made here, each at the token it is about: an
//!   `async fn`, with a body, returning a `Result<T, E>` (or what may be an alias of one), taking
//!   `&self` or `&mut self` rather than an owned `self`.
//! - [`Params`] lists every name the parameters bind, with whether the body owns it (and so gets a
//!   clone of it on every attempt) or borrows it.

use proc_macro2::{Delimiter, Group, Span};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{Attribute, FnArg, Ident, Pat, ReturnType, Signature, Token, Type, Visibility};

use crate::diagnostics::Errors;
use crate::display::display;

/// A function, with its body kept as tokens (like tracing-attributes' `MaybeItemFn`).
pub(crate) struct Func {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    /// `None` for a declaration without a body (`fn f();` in a trait).
    pub(crate) body: Option<Group>,
}

impl Parse for Func {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        let sig: Signature = input.parse().map_err(|_| {
            syn::Error::new(
                Span::call_site(),
                "`#[idempotent]` goes on an `async fn` that returns `Result<T, E>`",
            )
        })?;
        if input.peek(Token![;]) {
            input.parse::<Token![;]>()?;
            return Ok(Func {
                attrs,
                vis,
                sig,
                body: None,
            });
        }
        let body: Group = input.parse()?;
        if body.delimiter() != Delimiter::Brace {
            return Err(syn::Error::new(body.span(), "expected the function's body"));
        }
        Ok(Func {
            attrs,
            vis,
            sig,
            body: Some(body),
        })
    }
}

/// Group 1 of the compile-time checks: an `async fn` with a body, returning a path type
/// (`Result<T, E>` or an alias of it), without an owned `self`. Returns the return type.
pub(crate) fn check(func: &Func) -> syn::Result<&Type> {
    let sig = &func.sig;
    let name = sig.ident.unraw();
    let mut errors = Errors::default();
    if sig.asyncness.is_none() {
        errors.add(syn::Error::new(
            sig.fn_token.span,
            format!(
                "`#[idempotent]` goes on an `async fn`: each attempt, backoff and receipt lookup is awaited; write `async fn {name}(...)`"
            ),
        ));
    }
    for input in &sig.inputs {
        if let FnArg::Receiver(r) = input {
            if receiver_is_owned(r) {
                errors.add(syn::Error::new_spanned(
                    r,
                    "`#[idempotent]` methods take `&self` or `&mut self`: the body may run once per attempt, and an owned `self` could only be moved into the first one",
                ));
            }
        }
    }
    if func.body.is_none() {
        errors.add(syn::Error::new_spanned(
            sig,
            "`#[idempotent]` needs the function's body: put it on the implementation, not on a declaration",
        ));
    }
    let ret = match &sig.output {
        ReturnType::Default => {
            errors.add(syn::Error::new(
                sig.paren_token.span.join(),
                format!(
                    "`#[idempotent]` functions must return `Result<T, E>`: add `-> Result<T, E>` after `{name}(...)`, where `E` implements `samekey::Classify` and `From<samekey::Error>`"
                ),
            ));
            None
        }
        ReturnType::Type(_, ty) => {
            let mut inner: &Type = ty;
            while let Type::Group(g) = inner {
                inner = &g.elem;
            }
            let plain = match inner {
                Type::Path(p) if p.qself.is_none() => Some(p),
                _ => None,
            };
            if plain.is_some_and(|p| !surely_not_result(&p.path)) {
                Some(&**ty)
            } else {
                errors.add(syn::Error::new_spanned(
                    ty,
                    format!(
                        "`#[idempotent]` functions must return `Result<T, E>`, not `{}`: the error tells the runtime whether an attempt may be retried, and the outcome is stored as a receipt",
                        display(ty.to_token_stream())
                    ),
                ));
                None
            }
        }
    };
    match (errors.into_error(), ret) {
        (None, Some(ret)) => Ok(ret),
        (Some(e), _) => Err(e),
        (None, None) => Err(syn::Error::new(Span::call_site(), "missing return type")),
    }
}

/// Whether `path` names a type that is certainly not a `Result` (nor an alias of one): such a return
/// type is refused here, with one message, instead of by each use of it in the expansion. Any other
/// path may be an alias (`io::Result<T>`, `type Res<T> = ...`) and is left to the trait check.
fn surely_not_result(path: &syn::Path) -> bool {
    const NOT_RESULT: &[&str] = &[
        "String", "str", "Vec", "Option", "Box", "Arc", "Rc", "Cow", "HashMap", "BTreeMap",
        "HashSet", "BTreeSet", "VecDeque", "bool", "char", "u8", "u16", "u32", "u64", "u128",
        "usize", "i8", "i16", "i32", "i64", "i128", "isize", "f32", "f64",
    ];
    path.segments
        .last()
        .is_some_and(|s| NOT_RESULT.iter().any(|name| s.ident == name))
}

/// `self`, `mut self`, `self: Box<Self>`, `self: Arc<Self>`, … — anything but a reference or a
/// `Pin` of one.
fn receiver_is_owned(r: &syn::Receiver) -> bool {
    if r.reference.is_some() {
        return false;
    }
    if r.colon_token.is_none() {
        return true;
    }
    let mut ty: &Type = &r.ty;
    while let Type::Group(g) = ty {
        ty = &g.elem;
    }
    match ty {
        Type::Reference(_) => false,
        Type::Path(p) => !matches!(p.path.segments.last(), Some(s) if s.ident == "Pin"),
        _ => true,
    }
}

/// A name bound by the function's parameters.
pub(crate) struct Param {
    pub(crate) ident: Ident,
    /// `mut x`.
    pub(crate) mutability: Option<syn::Token![mut]>,
    /// `ref x`: already a reference, never cloned.
    pub(crate) by_ref: bool,
    /// The declared type, when the parameter is a plain `name: Type` (not destructured).
    pub(crate) ty: Option<Type>,
    /// The parameter is passed by value (its declared type is not a reference nor `impl Trait`),
    /// so the body gets a clone of it on every attempt.
    pub(crate) owned: bool,
    /// The whole declared type, for spans.
    pub(crate) ty_span: Span,
}

/// The function's parameters: the names a key part may start with, and the bindings each attempt
/// gets a clone of.
pub(crate) struct Params {
    pub(crate) fn_name: String,
    pub(crate) receiver: bool,
    pub(crate) list: Vec<Param>,
}

impl Params {
    pub(crate) fn of(sig: &Signature) -> Params {
        let mut params = Params {
            fn_name: sig.ident.unraw().to_string(),
            receiver: false,
            list: Vec::new(),
        };
        for input in &sig.inputs {
            match input {
                FnArg::Receiver(_) => params.receiver = true,
                FnArg::Typed(pt) => {
                    let ty = strip_group(&pt.ty);
                    // An `impl Trait` argument is a value the function owns (a hidden type
                    // parameter): each attempt gets its own copy, like any owned parameter.
                    let owned = !matches!(ty, Type::Reference(_));
                    let declared = match &*pt.pat {
                        Pat::Ident(_) => Some(ty.clone()),
                        _ => None,
                    };
                    let mut found = Vec::new();
                    bindings(&pt.pat, &mut found);
                    for (ident, mutability, by_ref) in found {
                        params.list.push(Param {
                            ident,
                            mutability,
                            by_ref,
                            ty: declared.clone(),
                            owned,
                            ty_span: pt.ty.span(),
                        });
                    }
                }
            }
        }
        params
    }

    pub(crate) fn find(&self, name: &str) -> Option<&Param> {
        self.list.iter().find(|p| p.ident.unraw() == name)
    }

    pub(crate) fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        if self.receiver {
            names.push("self".into());
        }
        names.extend(self.list.iter().map(|p| p.ident.unraw().to_string()));
        names
    }
}

fn strip_group(ty: &Type) -> &Type {
    match ty {
        Type::Group(g) => strip_group(&g.elem),
        Type::Paren(p) => strip_group(&p.elem),
        _ => ty,
    }
}

/// The names a pattern binds, with their `mut` and whether they bind by reference.
fn bindings(pat: &Pat, out: &mut Vec<(Ident, Option<syn::Token![mut]>, bool)>) {
    match pat {
        Pat::Ident(p) => {
            out.push((p.ident.clone(), p.mutability, p.by_ref.is_some()));
            if let Some((_, sub)) = &p.subpat {
                bindings(sub, out);
            }
        }
        Pat::Tuple(t) => t.elems.iter().for_each(|p| bindings(p, out)),
        Pat::TupleStruct(t) => t.elems.iter().for_each(|p| bindings(p, out)),
        Pat::Struct(s) => s.fields.iter().for_each(|f| bindings(&f.pat, out)),
        Pat::Slice(s) => s.elems.iter().for_each(|p| bindings(p, out)),
        Pat::Reference(r) => bindings(&r.pat, out),
        Pat::Paren(p) => bindings(&p.pat, out),
        Pat::Type(t) => bindings(&t.pat, out),
        Pat::Or(o) => {
            if let Some(first) = o.cases.first() {
                bindings(first, out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn params(sig: &str) -> Params {
        let sig: Signature = syn::parse_str(sig).unwrap();
        Params::of(&sig)
    }

    pub(crate) fn charge() -> Params {
        params(
            "async fn charge(&self, order: &Order, op: Op, amount: Cents, price: f64, \
             tags: HashMap<String, u32>, seen: Vec<Option<f32>>, at: std::time::Instant, \
             call: samekey::CallId, ids: &FxHashSet<u64>, (a, mut b): (u32, u32), attempt: u32) \
             -> Result<u32, E>",
        )
    }

    #[test]
    fn params_of_signature() {
        let p = charge();
        assert!(p.receiver);
        let owned: Vec<String> = p
            .list
            .iter()
            .filter(|p| p.owned)
            .map(|p| p.ident.to_string())
            .collect();
        assert_eq!(
            owned,
            ["op", "amount", "price", "tags", "seen", "at", "call", "a", "b", "attempt"]
        );
        let b = p.list.iter().find(|p| p.ident == "b").unwrap();
        assert!(b.mutability.is_some() && b.ty.is_none());
        let p = params("async fn f(x: impl AsRef<str>, ref y: String, _: u8) -> Result<(), E>");
        assert!(!p.receiver);
        assert!(p.list[0].owned, "an `impl Trait` argument is owned");
        assert!(p.list[1].by_ref);
        assert_eq!(p.list.len(), 2);
    }
}
