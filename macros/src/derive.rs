//! `#[derive(KeyPart)]`: a stable, unambiguous key encoding for user structs and enums.
//!
//! A struct encodes as `record(n)` followed by its `n` kept fields in declaration order; an enum
//! as `variant("Name", n)` followed by that variant's fields. Fields marked `#[key_part(skip)]` are
//! neither encoded nor counted. A variant may keep its old name in keys with
//! `#[key_part(rename = "Old")]`, so renaming it in code does not change the keys already stored.
//! Every type parameter gets a `KeyPart` bound, and each field's encode call is spanned at the
//! field's type, so "`f64` is not a stable key part" points at the field.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Attribute, Data, DeriveInput, Fields, Ident, LitStr, Member};

use crate::diagnostics::Errors;

/// The entry point of `#[derive(KeyPart)]`, on `proc_macro2` tokens.
pub(crate) fn key_part(input: TokenStream) -> TokenStream {
    match syn::parse2::<DeriveInput>(input).and_then(|input| expand(&input)) {
        Ok(tokens) => tokens,
        Err(err) => err.to_compile_error(),
    }
}

fn expand(input: &DeriveInput) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("key_part")) {
        errors.add(syn::Error::new_spanned(
            attr,
            "`#[key_part(...)]` goes on fields (`#[key_part(skip)]`) or enum variants (`#[key_part(rename = \"Old\")]`), not on the type",
        ));
    }
    let out = Ident::new("__samekey_out", Span::mixed_site());

    let body = match &input.data {
        Data::Struct(data) => match fields(&data.fields) {
            Ok(kept) => {
                let n = kept.len();
                let (pattern, encodes) = destructure(&kept, &out);
                quote! {
                    ::samekey::key::KeyEncoder::record(#out, #n);
                    match self {
                        Self { #(#pattern,)* .. } => { #(#encodes)* }
                    }
                }
            }
            Err(e) => {
                errors.add(e);
                TokenStream::new()
            }
        },
        Data::Enum(data) => {
            let mut arms = Vec::new();
            let mut names: Vec<(String, &Ident)> = Vec::new();
            for variant in &data.variants {
                let (name, span) = match variant_name(&variant.attrs, &variant.ident) {
                    Ok(named) => named,
                    Err(e) => {
                        errors.add(e);
                        continue;
                    }
                };
                if let Some((_, first)) = names.iter().find(|(n, _)| *n == name) {
                    errors.add(syn::Error::new(
                        span,
                        format!(
                            "variants `{}` and `{}` both encode as \"{name}\" in keys: two different values would get the same key, and one call would replay the other's outcome; give each variant a name of its own with `#[key_part(rename = \"...\")]`",
                            first.unraw(),
                            variant.ident.unraw(),
                        ),
                    ));
                }
                names.push((name.clone(), &variant.ident));
                match fields(&variant.fields) {
                    Ok(kept) => {
                        let n = kept.len();
                        let ident = &variant.ident;
                        let (pattern, encodes) = destructure(&kept, &out);
                        arms.push(quote! {
                            Self::#ident { #(#pattern,)* .. } => {
                                ::samekey::key::KeyEncoder::variant(#out, #name, #n);
                                #(#encodes)*
                            }
                        });
                    }
                    Err(e) => errors.add(e),
                }
            }
            if data.variants.is_empty() {
                // `&Never` is inhabited as far as `match` is concerned; `Never` is not.
                quote!(match *self {})
            } else {
                quote!(match self { #(#arms)* })
            }
        }
        Data::Union(data) => {
            errors.add(syn::Error::new(
                data.union_token.span,
                "`#[derive(KeyPart)]` does not support unions: nothing says which field is set; implement `samekey::KeyPart` by hand",
            ));
            TokenStream::new()
        }
    };
    errors.finish(())?;

    let name = &input.ident;
    let mut generics = input.generics.clone();
    let params: Vec<Ident> = generics.type_params().map(|t| t.ident.clone()).collect();
    if !params.is_empty() {
        let where_clause = generics.make_where_clause();
        for param in params {
            where_clause
                .predicates
                .push(syn::parse_quote!(#param: ::samekey::KeyPart));
        }
    }
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    Ok(quote! {
        #[automatically_derived]
        impl #impl_generics ::samekey::KeyPart for #name #ty_generics #where_clause {
            fn encode_key(&self, #out: &mut ::samekey::key::KeyEncoder) {
                #body
            }
        }
    })
}

/// The fields that are encoded (not `#[key_part(skip)]`), with their member and type.
fn fields(fields: &Fields) -> syn::Result<Vec<(Member, &syn::Type)>> {
    let mut kept = Vec::new();
    let mut errors = Errors::default();
    for (i, field) in fields.iter().enumerate() {
        match skipped(&field.attrs) {
            Ok(true) => {}
            Ok(false) => {
                let member = match &field.ident {
                    Some(ident) => Member::Named(ident.clone()),
                    None => Member::Unnamed(i.into()),
                };
                kept.push((member, &field.ty));
            }
            Err(e) => errors.add(e),
        }
    }
    errors.finish(kept)
}

/// `#[key_part(skip)]` on a field.
fn skipped(attrs: &[Attribute]) -> syn::Result<bool> {
    let mut skip = false;
    for attr in attrs.iter().filter(|a| a.path().is_ident("key_part")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("skip") {
                skip = true;
                Ok(())
            } else {
                Err(meta.error(
                    "unknown option of `#[key_part(...)]` on a field: the only one is `#[key_part(skip)]`",
                ))
            }
        })?;
    }
    Ok(skip)
}

/// The name a variant has in keys: its own, or `#[key_part(rename = "...")]`.
/// The name a variant is encoded under, and where it is written (the `rename` literal, else the
/// variant's name).
fn variant_name(attrs: &[Attribute], ident: &Ident) -> syn::Result<(String, Span)> {
    let mut named = (ident.unraw().to_string(), ident.span());
    for attr in attrs.iter().filter(|a| a.path().is_ident("key_part")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("rename") {
                let lit: LitStr = meta.value()?.parse()?;
                named = (lit.value(), lit.span());
                Ok(())
            } else {
                Err(meta.error(
                    "unknown option of `#[key_part(...)]` on a variant: the only one is `#[key_part(rename = \"...\")]`",
                ))
            }
        })?;
    }
    Ok(named)
}

/// `member: binding` patterns and the encode call of each binding. The binding is spanned at the
/// field's type (in the pattern and in the call alike, so hygiene matches), which is where rustc
/// then reports a field type that is not `KeyPart`.
fn destructure(kept: &[(Member, &syn::Type)], out: &Ident) -> (Vec<TokenStream>, Vec<TokenStream>) {
    kept.iter()
        .enumerate()
        .map(|(i, (member, ty))| {
            let span = ty.span();
            let mut binding = format_ident!("__samekey_field_{}", i);
            binding.set_span(span);
            let pattern = quote!(#member: #binding);
            let encode = quote_spanned! {span=>
                ::samekey::KeyPart::encode_key(#binding, #out);
            };
            (pattern, encode)
        })
        .unzip()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn derive(src: &str) -> String {
        key_part(src.parse().unwrap()).to_string()
    }

    #[test]
    fn named_struct() {
        let out = derive("struct Order { id: u64, #[key_part(skip)] note: String, op: Op }");
        assert!(
            out.contains("impl :: samekey :: KeyPart for Order {"),
            "{out}"
        );
        assert!(
            out.contains("KeyEncoder :: record (__samekey_out , 2usize) ;"),
            "{out}"
        );
        assert!(
            out.contains("Self { id : __samekey_field_0 , op : __samekey_field_1 , .. }"),
            "{out}"
        );
        assert!(
            out.contains(
                ":: samekey :: KeyPart :: encode_key (__samekey_field_1 , __samekey_out) ;"
            ),
            "{out}"
        );
        assert!(!out.contains("note"), "{out}");
    }

    #[test]
    fn tuple_and_unit_structs() {
        let out = derive("struct Pair(u64, #[key_part(skip)] u8, String);");
        assert!(out.contains("record (__samekey_out , 2usize)"), "{out}");
        assert!(
            out.contains("Self { 0 : __samekey_field_0 , 2 : __samekey_field_1 , .. }"),
            "{out}"
        );
        let out = derive("struct Unit;");
        assert!(out.contains("record (__samekey_out , 0usize)"), "{out}");
    }

    #[test]
    fn enums() {
        let out = derive(
            "enum Op { Charge { amount: u64 }, Refund(u64, #[key_part(skip)] String), #[key_part(rename = \"Nothing\")] Noop }",
        );
        assert!(out.contains("Self :: Charge { amount : __samekey_field_0 , .. } => { :: samekey :: key :: KeyEncoder :: variant (__samekey_out , \"Charge\" , 1usize) ;"), "{out}");
        assert!(
            out.contains("Self :: Refund { 0 : __samekey_field_0 , .. }"),
            "{out}"
        );
        assert!(
            out.contains("variant (__samekey_out , \"Nothing\" , 0usize)"),
            "{out}"
        );
        let out = derive("enum Never {}");
        assert!(out.contains("match * self { }"), "{out}");
    }

    #[test]
    fn generics_get_bounds() {
        let out = derive("struct W<'a, T: Clone, const N: usize> where T: Send { t: &'a [T; N] }");
        assert!(out.contains("impl < 'a , T : Clone , const N : usize > :: samekey :: KeyPart for W < 'a , T , N > where T : Send , T : :: samekey :: KeyPart {"), "{out}");
    }

    #[test]
    fn rejects() {
        let out = derive("union U { a: u8, b: u16 }");
        assert!(out.contains("does not support unions"), "{out}");
        let out = derive("struct S { #[key_part(skipp)] a: u8 }");
        assert!(out.contains("the only one is `#[key_part(skip)]`"), "{out}");
        let out = derive("#[key_part(skip)] struct S { a: u8 }");
        assert!(out.contains("goes on fields"), "{out}");
        let out = derive("enum E { #[key_part(skip)] A }");
        assert!(out.contains("on a variant"), "{out}");
    }
}
