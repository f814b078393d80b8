//! `#[interface]`: declare a server's interface once as a Rust trait, get a typed
//! client and a server-side demultiplexer (the papers' MIG).
//!
//! The macro only generates code; encoding, the wire conventions and the server loop
//! live in `ictus-idl`, so what it emits stays small and readable. See
//! `doc/interfaces.md`.
#![forbid(unsafe_code)]

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{
    parse_macro_input, FnArg, GenericArgument, Ident, ItemTrait, LitInt, Pat, PathArguments, ReturnType, TraitItem,
    Type,
};

/// Declare an interface.
///
/// ```ignore
/// #[ictus_idl::interface(id = 4000)]
/// pub trait Echo {
///     /// A routine: request and reply.
///     #[id(1)]
///     fn echo(&self, cx: &ictus_idl::Context, text: String) -> Result<String, ictus_idl::Status>;
///     /// A simple routine: one way, no reply.
///     #[id(2)]
///     #[oneway]
///     fn log(&self, line: String);
/// }
/// ```
///
/// Every method needs `#[id(N)]`: its message id is the interface's `id` plus `N`, so
/// ids stay stable when methods are added or reordered. A routine returns
/// `Result<T, E>` with `E: ictus_idl::RemoteError`; a `#[oneway]` method returns
/// nothing. An optional first parameter `cx: &Context` gives the server the request's
/// kernel-verified sender; it is not sent. Generated: the trait (unchanged but for the
/// attributes), `EchoClient` with one typed method per routine, and `EchoServer<T>`,
/// an `ictus_idl::Service` dispatching by message id to an `impl Echo`.
#[proc_macro_attribute]
pub fn interface(attr: TokenStream, item: TokenStream) -> TokenStream {
    let base = match parse_base(attr) {
        Ok(b) => b,
        Err(e) => return e.to_compile_error().into(),
    };
    let tr = parse_macro_input!(item as ItemTrait);
    match expand(base, tr) {
        Ok(ts) => ts.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn parse_base(attr: TokenStream) -> syn::Result<i32> {
    let mut base = None;
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("id") {
            let lit: LitInt = meta.value()?.parse()?;
            base = Some(lit.base10_parse::<i32>()?);
            Ok(())
        } else {
            Err(meta.error("expected `id = N`"))
        }
    });
    syn::parse::Parser::parse(parser, attr)?;
    base.ok_or_else(|| syn::Error::new(Span::call_site(), "#[interface] needs `id = N`, the first message id"))
}

struct Arg {
    name: Ident,
    ty: Type,
}

struct Method {
    name: Ident,
    offset: i32,
    oneway: bool,
    has_cx: bool,
    args: Vec<Arg>,
    ok: Type,
    err: Option<Type>,
    docs: Vec<syn::Attribute>,
}

fn expand(base: i32, mut tr: ItemTrait) -> syn::Result<TokenStream2> {
    let mut methods = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for item in &mut tr.items {
        let TraitItem::Fn(f) = item else {
            return Err(syn::Error::new(item.span(), "an interface holds methods only"));
        };
        let mut offset = None;
        let mut oneway = false;
        let mut docs = Vec::new();
        let mut keep = Vec::new();
        for a in f.attrs.drain(..) {
            if a.path().is_ident("id") {
                let lit: LitInt = a.parse_args()?;
                offset = Some(lit.base10_parse::<i32>()?);
            } else if a.path().is_ident("oneway") {
                oneway = true;
            } else {
                if a.path().is_ident("doc") {
                    docs.push(a.clone());
                }
                keep.push(a);
            }
        }
        f.attrs = keep;
        let name = f.sig.ident.clone();
        let offset = offset.ok_or_else(|| {
            syn::Error::new(name.span(), format!("method `{name}` needs #[id(N)]: a stable message id"))
        })?;
        if !(0..100).contains(&offset) {
            return Err(syn::Error::new(name.span(), "#[id(N)] takes 0..=99: replies use id + 100"));
        }
        if let Some(other) = seen.insert(offset, name.to_string()) {
            return Err(syn::Error::new(name.span(), format!("message id {offset} is already used by `{other}`")));
        }
        if f.default.is_some() {
            return Err(syn::Error::new(f.default.span(), "interface methods have no body"));
        }
        if !f.sig.generics.params.is_empty() || f.sig.asyncness.is_some() {
            return Err(syn::Error::new(f.sig.span(), "interface methods are neither generic nor async"));
        }
        let mut inputs = f.sig.inputs.iter();
        match inputs.next() {
            Some(FnArg::Receiver(r)) if r.reference.is_some() && r.mutability.is_none() => {}
            other => {
                return Err(syn::Error::new(
                    other.map_or(f.sig.span(), |o| o.span()),
                    "interface methods take `&self`: a server is shared by its threads",
                ))
            }
        }
        let mut args = Vec::new();
        let mut has_cx = false;
        for (i, input) in inputs.enumerate() {
            let FnArg::Typed(pt) = input else { unreachable!("receiver is first") };
            if i == 0 && is_context(&pt.ty) {
                has_cx = true;
                continue;
            }
            let Pat::Ident(pi) = &*pt.pat else {
                return Err(syn::Error::new(pt.pat.span(), "arguments must be plain names"));
            };
            check_wire_type(&pt.ty)?;
            args.push(Arg { name: pi.ident.clone(), ty: (*pt.ty).clone() });
        }
        let (ok, err) = match (&f.sig.output, oneway) {
            (ReturnType::Default, true) => (syn::parse_quote!(()), None),
            (ReturnType::Type(_, t), true) => {
                return Err(syn::Error::new(t.span(), "a #[oneway] method returns nothing: no reply is sent"))
            }
            (ReturnType::Default, false) => {
                return Err(syn::Error::new(
                    f.sig.span(),
                    "a routine returns Result<T, E>; mark one-way methods #[oneway]",
                ))
            }
            (ReturnType::Type(_, t), false) => {
                let (ok, err) = split_result(t)?;
                check_wire_type(&ok)?;
                (ok, Some(err))
            }
        };
        methods.push(Method { name, offset, oneway, has_cx, args, ok, err, docs });
    }

    let trait_name = &tr.ident;
    let vis = &tr.vis;
    let client = format_ident!("{}Client", trait_name);
    let server = format_ident!("{}Server", trait_name);
    let first = base;
    let last = base + methods.iter().map(|m| m.offset).max().unwrap_or(0);

    let mut client_methods = Vec::new();
    let mut id_consts = Vec::new();
    let mut arms = Vec::new();
    for m in &methods {
        let id = base + m.offset;
        let name = &m.name;
        let const_name = format_ident!("{}", name.to_string().to_uppercase());
        id_consts.push(quote! {
            #[doc = concat!("Message id of `", stringify!(#name), "`.")]
            pub const #const_name: i32 = #id;
        });
        let docs = &m.docs;
        let params: Vec<TokenStream2> = m
            .args
            .iter()
            .map(|a| {
                let n = &a.name;
                let t = client_arg_type(&a.ty);
                quote! { #n: #t }
            })
            .collect();
        let encodes: Vec<TokenStream2> = m
            .args
            .iter()
            .map(|a| {
                let n = &a.name;
                quote_spanned! { a.ty.span() => ::ictus_idl::Encode::encode(#n, &mut __enc)?; }
            })
            .collect();
        let decodes: Vec<TokenStream2> = m
            .args
            .iter()
            .map(|a| {
                let n = &a.name;
                let t = &a.ty;
                quote_spanned! { t.span() => let #n: #t = ::ictus_idl::Decode::decode(&mut __dec)?; }
            })
            .collect();
        let arg_names: Vec<&Ident> = m.args.iter().map(|a| &a.name).collect();
        let cx_arg = if m.has_cx { quote!(&__cx,) } else { quote!() };
        if m.oneway {
            client_methods.push(quote! {
                #(#docs)*
                pub fn #name(&self, #(#params),*) -> ::std::result::Result<(), ::ictus_idl::ClientError<::ictus_idl::Status>> {
                    let mut __enc = ::ictus_idl::Encoder::new(#id);
                    #(#encodes)*
                    self.__conn.send(__enc)
                }
            });
            arms.push(quote! {
                #id => {
                    let mut __dec = ::ictus_idl::Decoder::new(__req);
                    let __args = (|| -> ::std::result::Result<_, ::ictus_idl::DecodeError> {
                        #(#decodes)*
                        __dec.finish()?;
                        Ok((#(#arg_names,)*))
                    })();
                    match __args {
                        Ok((#(#arg_names,)*)) => {
                            let __cx = ::ictus_idl::Context::new(__space, __req);
                            let _ = &__cx;
                            self.0.#name(#cx_arg #(#arg_names),*);
                            ::ictus_idl::Outcome::OneWay
                        }
                        Err(e) => ::ictus_idl::Outcome::BadRequest(e),
                    }
                }
            });
        } else {
            let ok = &m.ok;
            let err = m.err.as_ref().expect("routine");
            let client_ok = client_result_type(ok);
            client_methods.push(quote! {
                #(#docs)*
                pub fn #name(&self, #(#params),*) -> ::std::result::Result<#client_ok, ::ictus_idl::ClientError<#err>> {
                    let mut __enc = ::ictus_idl::Encoder::new(#id);
                    #(#encodes)*
                    let mut __reply = self.__conn.call(__enc)?;
                    let mut __dec = ::ictus_idl::Decoder::reply::<#err>(&self.__conn, &mut __reply, #id)?;
                    let __out: ::std::result::Result<#client_ok, ::ictus_idl::DecodeError> = (|| {
                        let __v = ::ictus_idl::Decode::decode(&mut __dec)?;
                        __dec.finish()?;
                        Ok(__v)
                    })();
                    __out.map_err(|e| self.__conn.bad_reply(&mut __reply, e))
                }
            });
            arms.push(quote! {
                #id => {
                    // A routine that nobody can hear is refused before it runs.
                    if __req.reply.is_none() {
                        return ::ictus_idl::Outcome::BadRequest(::ictus_idl::DecodeError::NoReplyRight);
                    }
                    let mut __dec = ::ictus_idl::Decoder::new(__req);
                    let __args = (|| -> ::std::result::Result<_, ::ictus_idl::DecodeError> {
                        #(#decodes)*
                        __dec.finish()?;
                        Ok((#(#arg_names,)*))
                    })();
                    match __args {
                        Ok((#(#arg_names,)*)) => {
                            let __cx = ::ictus_idl::Context::new(__space, __req);
                            let _ = &__cx;
                            let __result: ::std::result::Result<#ok, #err> = self.0.#name(#cx_arg #(#arg_names),*);
                            ::ictus_idl::reply(__req, #id, __result)
                        }
                        Err(e) => ::ictus_idl::Outcome::BadRequest(e),
                    }
                }
            });
        }
    }

    let doc_client = format!("Typed client stubs for [`{trait_name}`]: one method per routine.");
    let doc_server = format!(
        "Server side of [`{trait_name}`]: an [`ictus_idl::Service`] that decodes requests (ids {first}..={last}) and calls the trait's methods."
    );
    Ok(quote! {
        #tr

        #[doc = #doc_client]
        #[derive(Clone, Debug)]
        #vis struct #client {
            __conn: ::ictus_idl::Connection,
        }

        impl #client {
            #(#id_consts)*

            /// Stubs that send to `port` (a send right in `space`).
            pub fn new(space: &::ictus_idl::ictus_ipc::Space, port: ::ictus_idl::ictus_ipc::Name) -> Self {
                Self { __conn: ::ictus_idl::Connection::new(space, port) }
            }

            /// The same stubs, waiting at most `timeout` for each send and each reply.
            pub fn with_timeout(&self, timeout: ::std::time::Duration) -> Self {
                Self { __conn: self.__conn.with_timeout(timeout) }
            }

            /// The port these stubs send to.
            pub fn port(&self) -> ::ictus_idl::ictus_ipc::Name {
                self.__conn.port()
            }

            #(#client_methods)*
        }

        #[doc = #doc_server]
        #[derive(Debug)]
        #vis struct #server<T>(pub T);

        impl<T: #trait_name + Send + Sync> ::ictus_idl::Service for #server<T> {
            fn ids(&self) -> ::std::ops::RangeInclusive<i32> {
                #first..=#last
            }

            fn dispatch(&self, __space: &::ictus_idl::ictus_ipc::Space, __req: &mut ::ictus_idl::ictus_ipc::Received) -> ::ictus_idl::Outcome {
                match __req.id {
                    #(#arms)*
                    _ => ::ictus_idl::Outcome::NotMine,
                }
            }
        }
    })
}

fn last_segment(ty: &Type) -> Option<&syn::PathSegment> {
    match ty {
        Type::Path(p) if p.qself.is_none() => p.path.segments.last(),
        _ => None,
    }
}

fn is_context(ty: &Type) -> bool {
    match ty {
        Type::Reference(r) if r.mutability.is_none() => last_segment(&r.elem).is_some_and(|s| s.ident == "Context"),
        _ => false,
    }
}

fn split_result(t: &Type) -> syn::Result<(Type, Type)> {
    if let Some(seg) = last_segment(t) {
        if seg.ident == "Result" {
            if let PathArguments::AngleBracketed(ab) = &seg.arguments {
                let tys: Vec<&Type> = ab
                    .args
                    .iter()
                    .filter_map(|a| if let GenericArgument::Type(t) = a { Some(t) } else { None })
                    .collect();
                if tys.len() == 2 {
                    return Ok((tys[0].clone(), tys[1].clone()));
                }
            }
        }
    }
    Err(syn::Error::new(t.span(), "a routine returns Result<T, E>, spelled out (no alias)"))
}

/// Reject what cannot travel: references, raw pointers, functions, trait objects.
fn check_wire_type(t: &Type) -> syn::Result<()> {
    match t {
        Type::Path(_) => Ok(()),
        Type::Tuple(tt) => tt.elems.iter().try_for_each(check_wire_type),
        Type::Paren(p) => check_wire_type(&p.elem),
        Type::Reference(_) => {
            Err(syn::Error::new(t.span(), "references cannot travel in a message: use an owned type (String, Vec<u8>)"))
        }
        _ => Err(syn::Error::new(t.span(), "this type cannot travel in a message")),
    }
}

/// What the client passes for an argument the server receives as `t`.
fn client_arg_type(t: &Type) -> TokenStream2 {
    if let Some(seg) = last_segment(t) {
        if seg.ident == "String" {
            return quote!(&str);
        }
        if seg.ident == "OolRegion" {
            return quote!(::ictus_idl::ictus_ipc::OolBuffer);
        }
        if seg.ident == "Vec" {
            if let PathArguments::AngleBracketed(ab) = &seg.arguments {
                if let Some(GenericArgument::Type(inner)) = ab.args.first() {
                    if last_segment(inner).is_some_and(|s| s.ident == "u8") {
                        return quote!(&[u8]);
                    }
                }
            }
        }
    }
    quote!(#t)
}

/// What the client gets for a result the server returns as `t`.
fn client_result_type(t: &Type) -> TokenStream2 {
    match t {
        Type::Tuple(tt) => {
            let elems: Vec<TokenStream2> = tt.elems.iter().map(client_result_type).collect();
            if elems.len() == 1 {
                quote!((#(#elems,)*))
            } else {
                quote!((#(#elems),*))
            }
        }
        _ => {
            if last_segment(t).is_some_and(|s| s.ident == "OolBuffer") {
                quote!(::ictus_idl::ictus_ipc::OolRegion)
            } else {
                quote!(#t)
            }
        }
    }
}
