//! `#[samekey::scoped]`: on an `impl` block, puts the self type (as written) into the default scope of
//! every `#[idempotent]` method in it, so that same-named methods of two `impl` blocks in one module
//! are two operations with keys of their own. It adds one hidden argument to each `#[idempotent(...)]`
//! and changes nothing else; a method with its own `scope = "..."` keeps it.

use proc_macro2::TokenStream;
use quote::{quote, ToTokens};
use syn::{ImplItem, ItemImpl, LitStr, Meta};

use crate::args::IMPL_TYPE;
use crate::diagnostics::Errors;

/// The entry point of `#[scoped]`, on `proc_macro2` tokens.
pub(crate) fn scoped(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    if !args.is_empty() {
        errors.push_spanned(
            &args,
            "`#[samekey::scoped]` takes no arguments: it names the self type of the `impl` block in the default scope of its methods; give a method its own name with `#[idempotent(scope = \"...\")]`".into(),
        );
    }
    let mut block = match syn::parse2::<ItemImpl>(item.clone()) {
        Ok(block) => block,
        Err(_) => {
            let err = syn::Error::new(
                proc_macro2::Span::call_site(),
                "`#[samekey::scoped]` goes on an `impl` block whose methods carry `#[idempotent(...)]`",
            )
            .to_compile_error();
            return quote!(#err #item);
        }
    };
    let self_type: String = block
        .self_ty
        .to_token_stream()
        .to_string()
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let self_type = LitStr::new(&self_type, proc_macro2::Span::call_site());
    for impl_item in &mut block.items {
        let ImplItem::Fn(method) = impl_item else {
            continue;
        };
        for attr in &mut method.attrs {
            let is_idempotent = attr
                .path()
                .segments
                .last()
                .is_some_and(|s| s.ident == "idempotent");
            if !is_idempotent {
                continue;
            }
            let hidden = syn::Ident::new(IMPL_TYPE, proc_macro2::Span::call_site());
            match &mut attr.meta {
                Meta::List(list) => {
                    let tokens = std::mem::take(&mut list.tokens);
                    let sep = if tokens.is_empty() {
                        quote!()
                    } else {
                        quote!(,)
                    };
                    list.tokens = quote!(#tokens #sep #hidden = #self_type);
                }
                // `#[idempotent]` alone: `key` is missing, which `#[idempotent]` reports itself.
                Meta::Path(_) | Meta::NameValue(_) => {}
            }
        }
    }
    let errors = errors.into_error().map(|e| e.to_compile_error());
    quote!(#errors #block)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_self_type_in_each_idempotent_method() {
        let out = scoped(
            TokenStream::new(),
            quote! {
                impl Billing<Stripe> {
                    #[idempotent(key = "id")]
                    async fn charge(&self, id: u64) -> Result<u64, E> { Ok(id) }
                    #[samekey::idempotent(key = "id", scope = "refunds")]
                    async fn refund(&self, id: u64) -> Result<u64, E> { Ok(id) }
                    fn plain(&self) {}
                }
            },
        )
        .to_string();
        assert!(
            out.contains(
                r#"# [idempotent (key = "id" , __samekey_impl_type = "Billing<Stripe>")]"#
            ),
            "{out}"
        );
        assert!(
            out.contains(r#"# [samekey :: idempotent (key = "id" , scope = "refunds" , __samekey_impl_type = "Billing<Stripe>")]"#),
            "{out}"
        );
    }

    #[test]
    fn refuses_arguments_and_other_items() {
        let out = scoped(quote!(name), quote!(impl X {})).to_string();
        assert!(out.contains("takes no arguments"), "{out}");
        let out = scoped(
            TokenStream::new(),
            quote!(
                fn f() {}
            ),
        )
        .to_string();
        assert!(out.contains("goes on an `impl` block"), "{out}");
    }
}
