//! Stage 3: the expansion of `#[idempotent(...)]` — the function with its body rewritten into the
//! retry loop of `docs/rules.md`, *What the macro generates*, from input [`validate`](crate::validate) has
//! already checked: nothing here refuses anything.
//!
//! Guarantees:
//! - The signature is emitted as written (attributes, docs, visibility, generics, `where`, receiver);
//!   the body is kept as tokens and placed, unchanged, inside one `async` block per attempt.
//! - Every path is absolute, through `::samekey::__private`, and every name the expansion adds
//!   (`__samekey_key`, `__SAMEKEY_SPEC`, …) is prefixed and made at `Span::mixed_site()`.
//! - What rustc checks is spanned at the user's token: each key part's `KeyPart` bound at the part,
//!   a parameter's `Clone` at its type, the `Runtime` at `runtime = ...`, the lookup's shape at
//!   `lookup = ...`, and the attempt's type, the error codec and `Classify` at the return type.

use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Ident, LitStr};

use crate::args::{OnBusy, OnMissingKey, OnUnknown};
use crate::display::display;
use crate::key::Part;
use crate::signature::Func;
use crate::validate::{Checked, Policy};

/// The function, its body rewritten into the retry loop.
pub(crate) fn generate(checked: &Checked) -> TokenStream {
    let Checked {
        func,
        body,
        ret_ty,
        params,
        key,
        verify,
        policy,
        inputs,
        lookup,
        runtime,
        impl_type,
    } = checked;
    let Func {
        attrs, vis, sig, ..
    } = func;
    let hygienic = |name: &str| Ident::new(name, Span::mixed_site());
    let spec = hygienic("__SAMEKEY_SPEC");
    let key_var = hygienic("__samekey_key");
    let verify_var = hygienic("__samekey_verify");
    let builder = hygienic("__samekey_builder");
    let run = hygienic("__samekey_run");
    let step = hygienic("__samekey_step");
    let out = hygienic("__samekey_out");
    let attempt = hygienic("__samekey_attempt");
    let fake = hygienic("__samekey_fake");
    let call = hygienic("__samekey_call");

    let spec_value = spec_tokens(&sig.ident, impl_type.as_ref(), policy);

    // Key parts go through `named_part`, which notes a missing (`None`) top-level part by its name;
    // `verify` parts are not the key (a `None` there is a value), and go through `verify_part`, which
    // notes only a refused encoding.
    let build = |parts: &[Part], named: bool| {
        let calls = parts.iter().map(|part| {
            // `&(part)` runs from the part's first token to its last, so that rustc underlines
            // all of `order.price`, not only `order`, when the part is not `KeyPart`.
            let mut group = Group::new(Delimiter::Parenthesis, part.tokens.clone());
            group.set_span(part.last);
            if named {
                let name = display(part.tokens.clone());
                quote_spanned! {part.span=>
                    ::samekey::__private::KeyBuilder::named_part(&mut #builder, &#group, #name);
                }
            } else {
                let name = display(part.tokens.clone());
                quote_spanned! {part.span=>
                    ::samekey::__private::KeyBuilder::verify_part(&mut #builder, &#group, #name);
                }
            }
        });
        quote!({
            let mut #builder = ::samekey::__private::KeyBuilder::new_static(#spec.scope);
            #(#calls)*
            #builder
        })
    };
    let key_value = build(key, true);
    let verify_value = match verify {
        Some(parts) => {
            let b = build(parts, false);
            quote!(::core::option::Option::Some(#b))
        }
        None => quote!(::core::option::Option::None),
    };

    // For a method, `Self` tells apart the operations of one item under a default scope (a trait's
    // default method for each implementor, a generic `impl` for each type).
    let self_type = if params.receiver {
        quote!(::core::any::type_name::<Self>())
    } else {
        quote!("")
    };

    let runtime = match runtime {
        // Typed here, so that a runtime of the wrong type is reported as one at the argument.
        Some(expr) => {
            let typed = quote_spanned!(expr.span()=> ::core::option::Option::<&::samekey::Runtime>::Some(#expr));
            typed
        }
        None => quote!(::core::option::Option::None),
    };
    // Spanned at the return type: a return type that is not a `Result`, or an error type that
    // misses `Classify`/serde/`From<samekey::Error>`, is reported there.
    let ret_span = ret_ty.span();
    let begin = quote_spanned!(ret_span=> ::samekey::__private::begin::<#ret_ty>);
    // The error type is stored exactly when it has serde, else by its message: the choice is made by
    // method resolution on the concrete type (`ExactErrors` needs serde, `MessageErrors` is the
    // fallback), so that real error types (`#[from] reqwest::Error`) work unchanged.
    let codec = quote_spanned! {ret_span=> {
        #[allow(unused_imports)]
        use ::samekey::__private::{ExactErrors as _, MessageErrors as _};
        (&&::samekey::__private::Probe::<<#ret_ty as ::samekey::__private::CallResult>::Err>::new()).codec()
    }};
    // A `Clone` value is kept decoded by the in-process store for its replays; the choice, by method
    // resolution on the concrete value type, as for the error codec.
    let keeper = quote_spanned! {ret_span=> {
        #[allow(unused_imports)]
        use ::samekey::__private::{KeptValues as _, DecodedValues as _};
        (&&::samekey::__private::ValueProbe::<<#ret_ty as ::samekey::__private::CallResult>::Ok>::new()).keeper()
    }};
    let start = quote_spanned!(ret_span=> #run.start());
    // Each input is checked on its own (`input` names the one that cannot be encoded), at the
    // `inputs` argument.
    let keep_inputs = inputs.as_ref().map(|(span, names)| {
        quote_spanned! {*span=>
            #run.keep_inputs(&( #( ::samekey::__private::input(&#names), )* ));
        }
    });
    let run_attempt = quote_spanned!(ret_span=> #run.attempt(#attempt));
    let no_lookup = quote_spanned!(ret_span=> #run.no_lookup());

    // An owned `mut x` is only read by the per-attempt clones below: take it mutably once so that
    // rustc does not call the user's `mut` unused.
    let mut_uses = params
        .list
        .iter()
        .filter(|p| p.owned && !p.by_ref && p.mutability.is_some())
        .map(|p| {
            let ident = &p.ident;
            quote!(let _ = &mut #ident;)
        });
    let clones = params
        .list
        .iter()
        .filter(|p| p.owned && !p.by_ref)
        .map(|p| {
            let ident = &p.ident;
            let mutability = &p.mutability;
            let clone = quote_spanned!(p.ty_span=> ::samekey::__private::clone_param(&#ident));
            quote! {
                #[allow(unused_variables)]
                let #mutability #ident = #clone;
            }
        });

    let fake_return = quote_spanned! {ret_ty.span()=>
        #[allow(
            unknown_lints,
            unreachable_code,
            clippy::diverging_sub_expression,
            clippy::empty_loop,
            clippy::needless_return,
            clippy::let_unit_value
        )]
        if false {
            let #fake: #ret_ty = loop {};
            return #fake;
        }
    };

    // The lookup is written inside the arm (not before the loop: a closure that borrows `self` must not
    // live across attempts that borrow it mutably) and passed straight to `ask`, whose bound gives a
    // closure's parameter its type, `&CallId`, where the closure is written.
    let lookup_arm = match lookup {
        Some(lookup) => {
            // Spanned at the `lookup` argument: a lookup of the wrong shape is reported there.
            let ask = quote_spanned!(lookup.span()=>
                ::samekey::__private::Run::resolve(
                    &mut #run,
                    ::samekey::__private::ask(#lookup, &#call),
                ).await
            );
            quote! {
                ::samekey::__private::Step::Lookup(#call) => #ask,
            }
        }
        None => quote! {
            ::samekey::__private::Step::Lookup(_) => #no_lookup.await,
        },
    };

    // Through `CallResult`, so a return type that is not a `Result` gives one error (the trait's), at
    // the return type, instead of a cascade of mismatches.
    let ret = quote_spanned! {ret_ty.span()=>
        <#ret_ty as ::samekey::__private::CallResult>::from_result(#out)
    };

    quote! {
        #(#attrs)*
        #vis #sig {
            static #spec: ::samekey::__private::Spec = #spec_value;
            let #key_var = #key_value;
            let #verify_var: ::core::option::Option<::samekey::__private::KeyBuilder> = #verify_value;
            #(#mut_uses)*
            // A replay answered in `begin` returns here, before a run is moved into this future or
            // any step's future is made.
            let mut #run = match #begin(#runtime, &#spec, #self_type, #key_var, #verify_var, #codec, #keeper) {
                ::samekey::__private::Begun::Run(#run) => #run,
                ::samekey::__private::Begun::Answered(#out) => return #ret,
            };
            #keep_inputs
            let mut #step = #start.await;
            loop {
                #step = match #step {
                    ::samekey::__private::Step::Done(#out) => return #ret,
                    ::samekey::__private::Step::Attempt => {
                        #(#clones)*
                        // The body is placed as written, braces and all: a one-line `{ Ok(x) }` is
                        // not the user's unnecessary braces.
                        #[allow(unused_braces)]
                        let #attempt = async {
                            #fake_return
                            #body
                        };
                        #run_attempt.await
                    }
                    #lookup_arm
                };
            }
        }
    }
}

/// The `Spec` literal: every value already checked by `validate/policy.rs`.
fn spec_tokens(fn_ident: &Ident, impl_type: Option<&LitStr>, policy: &Policy) -> TokenStream {
    let name = fn_ident.unraw().to_string();
    let millis = |ms: u64| quote!(::core::time::Duration::from_millis(#ms));
    let optional = |ms: Option<u64>| match ms {
        Some(ms) => {
            let d = millis(ms);
            quote!(::core::option::Option::Some(#d))
        }
        None => quote!(::core::option::Option::None),
    };
    let scope = match (&policy.scope, impl_type) {
        (Some(scope), _) => quote!(#scope),
        (None, Some(self_type)) => {
            quote!(::core::concat!(::core::module_path!(), "::", #self_type, "::", #name))
        }
        (None, None) => quote!(::core::concat!(::core::module_path!(), "::", #name)),
    };
    let scope_given = policy.scope.is_some();
    let prefix = &policy.prefix;
    let retries = policy.retries;
    let budget = match &policy.budget {
        Some(name) => quote!(::core::option::Option::Some(#name)),
        None => quote!(::core::option::Option::None),
    };
    let base = millis(policy.backoff.0);
    let cap = millis(policy.backoff.1);
    let jitter = policy.jitter;
    let timeout = optional(policy.timeout);
    let ttl = millis(policy.ttl);
    let window = optional(policy.window);
    let on_busy = match policy.on_busy {
        OnBusy::Wait => format_ident!("Wait"),
        OnBusy::Reject => format_ident!("Reject"),
    };
    let on_unknown = match policy.on_unknown {
        OnUnknown::Hold => format_ident!("Hold"),
        OnUnknown::Rerun => format_ident!("Rerun"),
    };
    let has_lookup = policy.has_lookup;
    let on_missing_key = match policy.on_missing_key {
        OnMissingKey::Error => format_ident!("Error"),
        OnMissingKey::Run => format_ident!("Run"),
    };
    quote! {
        ::samekey::__private::Spec {
            scope: #scope,
            scope_given: #scope_given,
            operation: ::samekey::__private::OperationCell::new(),
            prefix: #prefix,
            name: #name,
            retries: #retries,
            budget: #budget,
            metrics: ::samekey::__private::MetricsCell::new(),
            backoff_base: #base,
            backoff_cap: #cap,
            jitter: #jitter,
            timeout: #timeout,
            ttl: #ttl,
            window: #window,
            on_busy: ::samekey::__private::OnBusy::#on_busy,
            on_unknown: ::samekey::__private::OnUnknown::#on_unknown,
            has_lookup: #has_lookup,
            on_missing_key: ::samekey::__private::OnMissingKey::#on_missing_key,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::validate::validate;

    fn run(args: &str, item: &str) -> String {
        let func: Func = syn::parse_str(item).unwrap();
        generate(&validate(args.parse().unwrap(), &func).unwrap()).to_string()
    }

    fn errors(args: &str, item: &str) -> Vec<String> {
        let func: Func = syn::parse_str(item).unwrap();
        match validate(args.parse().unwrap(), &func) {
            Ok(_) => Vec::new(),
            Err(e) => e.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    const CHARGE: &str =
        "async fn charge(&self, order: &Order, op: Op) -> Result<Charge, PayError> { \
                          self.gateway.charge(order.id).await }";

    #[test]
    fn expands_a_method() {
        let out = run(
            r#"key = "order.id + op", timeout = "3s", lookup = |c| self.gw.status(c)"#,
            CHARGE,
        );
        assert!(out.starts_with("async fn charge (& self , order : & Order , op : Op) -> Result < Charge , PayError > {"), "{out}");
        assert!(
            out.contains("static __SAMEKEY_SPEC : :: samekey :: __private :: Spec"),
            "{out}"
        );
        assert!(out.contains(":: samekey :: __private :: KeyBuilder :: named_part (& mut __samekey_builder , & (order . id) , \"order.id\") ;"), "{out}");
        assert!(
            out.contains(":: samekey :: __private :: begin :: < Result < Charge , PayError > >"),
            "{out}"
        );
        assert!(
            out.contains("let op = :: samekey :: __private :: clone_param (& op) ;"),
            "{out}"
        );
        assert!(!out.contains("clone_param (& order)"), "{out}");
        assert!(out.contains("timeout : :: core :: option :: Option :: Some (:: core :: time :: Duration :: from_millis (3000u64))"), "{out}");
        assert!(out.contains("prefix : \"cha\""), "{out}");
        assert!(
            out.contains(":: core :: concat ! (:: core :: module_path ! () , \"::\" , \"charge\")"),
            "{out}"
        );
        assert!(out.contains("has_lookup : true"), "{out}");
        assert!(
            out.contains("on_missing_key : :: samekey :: __private :: OnMissingKey :: Error"),
            "{out}"
        );
        assert!(
            out.contains("(&& :: samekey :: __private :: Probe :: << Result < Charge , PayError > as :: samekey :: __private :: CallResult > :: Err > :: new ()) . codec ()"),
            "the error codec is picked on the concrete error type: {out}"
        );
        assert!(
            out.contains("(&& :: samekey :: __private :: ValueProbe :: << Result < Charge , PayError > as :: samekey :: __private :: CallResult > :: Ok > :: new ()) . keeper ()"),
            "the value keeper is picked on the concrete value type: {out}"
        );
        assert!(out.contains("scope_given : false"), "{out}");
        assert!(
            out.contains("(:: core :: option :: Option :: None , & __SAMEKEY_SPEC , :: core :: any :: type_name :: < Self > () ,"),
            "a method's `Self` tells its operations apart: {out}"
        );
        assert!(
            out.contains(":: samekey :: __private :: Run :: resolve (& mut __samekey_run , :: samekey :: __private :: ask (| c | self . gw . status (c) , & __samekey_call) ,) . await"),
            "{out}"
        );
        assert!(
            out.contains("{ self . gateway . charge (order . id) . await }"),
            "{out}"
        );
        assert!(
            out.contains("let __samekey_fake : Result < Charge , PayError > = loop { } ;"),
            "{out}"
        );
        assert!(errors("key = \"order.id + op\"", CHARGE).is_empty());
    }

    #[test]
    fn expands_without_lookup_and_with_verify() {
        let out = run(
            r#"key = order.id, verify = op, scope = "orders.charge", on_busy = "reject", on_unknown = "rerun", runtime = &self.rt"#,
            CHARGE,
        );
        assert!(
            out.contains("Step :: Lookup (_) => __samekey_run . no_lookup () . await"),
            "{out}"
        );
        assert!(
            out.contains(":: core :: option :: Option :: Some ({ let mut __samekey_builder"),
            "{out}"
        );
        assert!(out.contains("scope : \"orders.charge\""), "{out}");
        assert!(out.contains("OnBusy :: Reject"), "{out}");
        assert!(out.contains("OnUnknown :: Rerun"), "{out}");
        assert!(
            out.contains(
                "begin :: < Result < Charge , PayError > > (:: core :: option :: Option :: < & :: samekey :: Runtime > :: Some (& self . rt) , & __SAMEKEY_SPEC"
            ),
            "{out}"
        );
    }

    #[test]
    fn clones_owned_bindings() {
        let out = run(
            "key = a",
            "async fn f(mut a: String, (b, mut c): (u8, u8), d: impl Fn(), e: &mut u8, ref g: u8, _: u8) -> Result<(), E> { Ok(()) }",
        );
        assert!(out.contains("let _ = & mut a ;"), "{out}");
        assert!(
            out.contains("let mut a = :: samekey :: __private :: clone_param (& a) ;"),
            "{out}"
        );
        assert!(
            out.contains("let b = :: samekey :: __private :: clone_param (& b) ;"),
            "{out}"
        );
        assert!(
            out.contains("let mut c = :: samekey :: __private :: clone_param (& c) ;"),
            "{out}"
        );
        assert!(
            out.contains("let d = :: samekey :: __private :: clone_param (& d) ;"),
            "an `impl Trait` argument is owned: {out}"
        );
        for skipped in ["(& e)", "(& g)"] {
            assert!(
                !out.contains(&format!("clone_param {skipped}")),
                "{skipped}: {out}"
            );
        }
    }

    #[test]
    fn keeps_attributes_generics_and_where() {
        let out = run(
            "key = id",
            "/// Docs.\n#[inline] pub(crate) async fn get<'a, T: Clone>(&'a self, id: u64, t: T) -> io::Result<T> where T: Send { Ok(t) }",
        );
        assert!(out.starts_with("# [doc = \" Docs.\"] # [inline] pub (crate) async fn get < 'a , T : Clone > (& 'a self , id : u64 , t : T) -> io :: Result < T > where T : Send {"), "{out}");
    }
}
