//! `#[derive(Module)]` for Tessera (re-exported as `tessera::nn::Module`).
//!
//! Every field is visited under its own name, in declaration order: a `Tensor` or
//! `Option<Tensor>` as a parameter, anything that implements `Module` (layers, `Vec`s
//! and `Option`s of them, boxed layers) as a child, anything else (sizes, options,
//! names) not at all. Attributes on a field:
//!
//! - `#[module(buffer)]`: a tensor that is state but not trained (running statistics);
//! - `#[module(skip)]`: not visited;
//! - `#[module(rename = "in_proj_weight")]`: the state-dict name differs from the field's.
//!
//! Which kind a field is gets decided by the compiler from its type (autoref-based
//! dispatch in `tessera::nn::derive`), so the macro needs no list of type names.

use proc_macro::TokenStream;
use proc_macro2::TokenStream as Tokens;
use quote::quote;
use syn::{parse_macro_input, Data, DeriveInput, Fields, LitStr};

enum Role {
    Parameter,
    Buffer,
}

struct FieldSpec {
    access: Tokens,
    name: String,
    role: Role,
}

fn fields(input: &DeriveInput) -> syn::Result<Vec<FieldSpec>> {
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(&input.ident, "#[derive(Module)] works on structs"));
    };
    let mut out = Vec::new();
    let list: Vec<_> = match &data.fields {
        Fields::Named(f) => f.named.iter().collect(),
        Fields::Unnamed(f) => f.unnamed.iter().collect(),
        Fields::Unit => Vec::new(),
    };
    for (i, f) in list.into_iter().enumerate() {
        let (access, mut name) = match &f.ident {
            Some(id) => (quote!(#id), id.to_string()),
            None => {
                let idx = syn::Index::from(i);
                (quote!(#idx), i.to_string())
            }
        };
        let mut role = Role::Parameter;
        let mut skip = false;
        for attr in f.attrs.iter().filter(|a| a.path().is_ident("module")) {
            attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("skip") {
                    skip = true;
                } else if meta.path.is_ident("buffer") {
                    role = Role::Buffer;
                } else if meta.path.is_ident("parameter") {
                    role = Role::Parameter;
                } else if meta.path.is_ident("rename") {
                    name = meta.value()?.parse::<LitStr>()?.value();
                } else {
                    return Err(meta.error("expected skip, buffer, parameter or rename = \"...\""));
                }
                Ok(())
            })?;
        }
        if !skip {
            out.push(FieldSpec { access, name, role });
        }
    }
    Ok(out)
}

/// Derive `tessera::nn::Module` from a struct's fields (see the crate docs).
#[proc_macro_derive(Module, attributes(module))]
pub fn derive_module(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    let specs = match fields(&input) {
        Ok(s) => s,
        Err(e) => return e.to_compile_error().into(),
    };
    let ident = &input.ident;
    let (impl_g, ty_g, where_c) = input.generics.split_for_impl();
    let role = |r: &Role| match r {
        Role::Parameter => quote!(::tessera::nn::Role::Parameter),
        Role::Buffer => quote!(::tessera::nn::Role::Buffer),
    };
    let reads = specs.iter().map(|f| {
        let (access, name, role) = (&f.access, &f.name, role(&f.role));
        quote! { (&&&::tessera::nn::derive::Field(&self.#access, #role)).visit_field(#name, v); }
    });
    let writes = specs.iter().map(|f| {
        let (access, name, role) = (&f.access, &f.name, role(&f.role));
        quote! { (&&&::tessera::nn::derive::FieldMut::new(&mut self.#access, #role)).visit_field_mut(#name, v); }
    });
    quote! {
        impl #impl_g ::tessera::nn::Module for #ident #ty_g #where_c {
            fn visit(&self, v: &mut dyn ::tessera::nn::Visitor) {
                #[allow(unused_imports)]
                use ::tessera::nn::derive::{ModuleField as _, OtherField as _, TensorField as _};
                #(#reads)*
            }
            fn visit_mut<'__m>(&'__m mut self, v: &mut dyn ::tessera::nn::VisitorMut<'__m>) {
                #[allow(unused_imports)]
                use ::tessera::nn::derive::{ModuleFieldMut as _, OtherFieldMut as _, TensorFieldMut as _};
                #(#writes)*
            }
        }
    }
    .into()
}
