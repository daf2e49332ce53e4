//! Stage 2: every check of `#[idempotent(...)]` against the function it is on, made before anything is
//! generated. [`validate`] runs them all and hands the expansion a [`Checked`]: the stage after it
//! only writes tokens, and refuses nothing.
//!
//! Guarantees:
//! - **All problems at once.** The signature (`signature`), the arguments' form (`args`), `key` and
//!   `verify` (`key`), the policy ([`policy`]), `inputs` and the generic parameters are all checked,
//!   in that order, even after one of them failed, and their errors are reported together, in that
//!   order, each at the token it is about. Only arguments that cannot be parsed at all stop early.
//! - **Argument combinations** are refused here: no `key`; `inputs` naming something that is not a
//!   plain parameter, or one twice; with the default scope, a type or const parameter that no
//!   parameter carries (its instantiations would share keys). The policy's own combinations
//!   (`timeout` without `lookup` or `on_unknown`, `ttl` against the retry span, …) are in [`policy`].

mod policy;

use proc_macro2::{Group, Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::{Expr, FnArg, Ident, LitStr, Signature, Type};

use crate::args::Args;
use crate::diagnostics::Errors;
use crate::key::{self, Part};
use crate::signature::{self, Func, Params};
pub(crate) use policy::Policy;

/// What the expansion is made from: the function, and every argument checked and resolved.
pub(crate) struct Checked<'a> {
    /// The function as written; its signature is emitted unchanged.
    pub(crate) func: &'a Func,
    /// Its body, kept as tokens.
    pub(crate) body: &'a Group,
    /// Its declared return type, which every attempt is pinned to.
    pub(crate) ret_ty: &'a Type,
    pub(crate) params: Params,
    pub(crate) key: Vec<Part>,
    pub(crate) verify: Option<Vec<Part>>,
    pub(crate) policy: Policy,
    /// `inputs = "a, b"`: where it is written, and the parameters it names.
    pub(crate) inputs: Option<(Span, Vec<Ident>)>,
    /// `lookup = ...`, as written.
    pub(crate) lookup: Option<Expr>,
    /// `runtime = ...`, as written.
    pub(crate) runtime: Option<Expr>,
    /// The self type of the `impl` block, from `#[samekey::scoped]`.
    pub(crate) impl_type: Option<LitStr>,
}

/// Parses the arguments and checks them, and the function, together; every problem found is in the
/// error.
pub(crate) fn validate(args: TokenStream, func: &Func) -> syn::Result<Checked<'_>> {
    let mut errors = Errors::default();
    let ret_ty = errors.take(signature::check(func));
    let params = Params::of(&func.sig);

    let args = match syn::parse2::<Args>(args) {
        Ok(mut args) => {
            if let Some(e) = args.errors.take() {
                errors.add(e);
            }
            Some(args)
        }
        Err(e) => {
            errors.add(e);
            None
        }
    };
    let Some(args) = args else {
        return Err(errors
            .into_error()
            .unwrap_or_else(|| syn::Error::new(Span::call_site(), "")));
    };

    let key = match &args.key {
        Some(value) => errors.take(key::parts("key", value, &params)),
        None => {
            errors.add(syn::Error::new(
                Span::call_site(),
                "`#[idempotent(...)]` needs a key: add `key = \"...\"` naming the parameters that identify the business operation, e.g. `#[idempotent(key = \"order.id + op\")]`",
            ));
            None
        }
    };
    // `Some(None)`: no `verify`; `None`: a `verify` that was refused.
    let verify = match &args.verify {
        Some(value) => errors.take(key::parts("verify", value, &params)).map(Some),
        None => Some(None),
    };
    let policy = errors.take(policy::check(&args, &func.sig.ident));
    let inputs = args
        .inputs
        .as_ref()
        .and_then(|lit| errors.take(inputs(lit, &params)));
    if args.scope.is_none() {
        errors.take(check_generics(&func.sig));
    }

    match (errors.into_error(), ret_ty, key, verify, policy, &func.body) {
        (None, Some(ret_ty), Some(key), Some(verify), Some(policy), Some(body)) => Ok(Checked {
            func,
            body,
            ret_ty,
            params,
            key,
            verify,
            policy,
            inputs,
            lookup: args.lookup,
            runtime: args.runtime,
            impl_type: args.impl_type,
        }),
        (Some(e), ..) => Err(e),
        _ => Err(syn::Error::new(
            Span::call_site(),
            "`#[idempotent]` could not expand this function",
        )),
    }
}

/// With a default scope, every type or const parameter must be carried by a parameter of the function:
/// one that is not (`subscribe::<Premium>(user)`) makes each instantiation a different operation that
/// the key cannot tell apart from the others. Parameters that only adapt an argument (`s: S` with
/// `S: Into<String>`, `impl Trait`) are fine: the argument is the same business value either way.
fn check_generics(sig: &Signature) -> syn::Result<()> {
    let mut errors = Errors::default();
    let name = sig.ident.unraw();
    for param in &sig.generics.params {
        let (ident, what) = match param {
            syn::GenericParam::Type(t) => (&t.ident, "type"),
            syn::GenericParam::Const(c) => (&c.ident, "const"),
            syn::GenericParam::Lifetime(_) => continue,
        };
        let carried = sig.inputs.iter().any(|input| match input {
            FnArg::Typed(pt) => mentions(pt.ty.to_token_stream(), ident),
            FnArg::Receiver(_) => false,
        });
        if !carried {
            errors.add(syn::Error::new(
                ident.span(),
                format!(
                    "{what} parameter `{ident}` of `{name}` is carried by no parameter, so `{name}::<A>` and `{name}::<B>` are different operations that would share one key scope (and each other's outcomes); pass what tells them apart as a parameter and name it in `key`, or, if every instantiation is the same operation, say so with `#[idempotent(scope = \"...\")]`"
                ),
            ));
        }
    }
    errors.finish(())
}

/// Whether `tokens` name `ident` anywhere.
fn mentions(tokens: TokenStream, ident: &Ident) -> bool {
    tokens.into_iter().any(|tt| match tt {
        proc_macro2::TokenTree::Ident(i) => i == *ident,
        proc_macro2::TokenTree::Group(g) => mentions(g.stream(), ident),
        _ => false,
    })
}

/// The parameters `inputs = "a, b"` names, each once, each a plain parameter of the function.
fn inputs(lit: &LitStr, params: &Params) -> syn::Result<(Span, Vec<Ident>)> {
    let text = lit.value();
    let known = || {
        params
            .list
            .iter()
            .map(|p| format!("`{}`", p.ident))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut names: Vec<Ident> = Vec::new();
    for name in text.split(',').map(str::trim) {
        if name.is_empty() {
            return Err(syn::Error::new(
                lit.span(),
                "`inputs` names the parameters a compensation entry keeps, separated by commas, e.g. `inputs = \"order_id, amount\"`",
            ));
        }
        let Some(param) = params.list.iter().find(|p| p.ident == name) else {
            return Err(syn::Error::new(
                lit.span(),
                format!(
                    "`inputs` names `{name}`, which is not a parameter of `{}`; its parameters: {}",
                    params.fn_name,
                    known()
                ),
            ));
        };
        if names.iter().any(|n| n == &param.ident) {
            return Err(syn::Error::new(
                lit.span(),
                format!("`inputs` names `{name}` twice"),
            ));
        }
        names.push(Ident::new(&param.ident.to_string(), lit.span()));
    }
    Ok((lit.span(), names))
}
