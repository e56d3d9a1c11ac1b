//! The test attributes of leasehold:
//! `#[leasehold::serial(name)]` and `#[leasehold::parallel(name)]`.
//!
//! Use them through leasehold, with its `macros` feature on, not through
//! this crate: the code they write calls `::leasehold::testing`.
//!
//! Each attribute adds one statement at the top of the function's body,
//! and changes nothing else:
//!
//! - on an `async fn` (`#[tokio::test]` below the attribute):
//!   `let _g = ::leasehold::testing::serial("name").await;`
//! - on any other `fn` (`#[test]`, or `#[tokio::test]` above the attribute,
//!   which has made the function synchronous by then):
//!   `let _g = ::leasehold::testing::blocking_serial("name");`
//!
//! (`parallel` and `blocking_parallel` for `#[leasehold::parallel]`.) The
//! guard lives until the function returns, however it returns: a value, an
//! `Err` through `?`, or a panic.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![doc(test(attr(deny(warnings))))]

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Attribute, Ident, LitStr, Signature, Visibility, braced};

/// Runs the test alone: no other test holding `name` through `serial` or
/// `parallel`, in this process or another, runs beside it. The attribute
/// form of `leasehold::testing::serial` (see that module's docs).
///
/// `name` is an identifier (`#[leasehold::serial(database)]`) or a string
/// literal (`#[leasehold::serial("db-1")]`), one per attribute. Put the
/// attribute above or below `#[test]` or `#[tokio::test]`; the function
/// may be async, and may return a `Result`.
///
/// # Examples
///
/// In a test suite:
///
/// ```no_run
/// #[leasehold::serial(database)]
/// #[tokio::test]
/// async fn migrates_the_database() -> Result<(), Box<dyn std::error::Error>> {
///     // ... no other test holding "database", in any process, runs now ...
///     Ok(())
/// }
///
/// #[test]
/// #[leasehold::serial(database)]
/// fn resets_the_database() {
///     // ...
/// }
/// # fn main() {}
/// ```
///
/// It works on any function; here it is called by hand:
///
/// ```
/// use leasehold::testing::blocking_is_held;
///
/// #[leasehold::serial(serial_doc_example)]
/// fn migrate() -> std::io::Result<()> {
///     assert!(blocking_is_held("serial_doc_example"));
///     Ok(())
/// }
///
/// fn main() -> std::io::Result<()> {
///     migrate()?;
///     assert!(!blocking_is_held("serial_doc_example")); // let go on return
///     Ok(())
/// }
/// ```
#[proc_macro_attribute]
pub fn serial(args: proc_macro::TokenStream, item: proc_macro::TokenStream) -> proc_macro::TokenStream {
    expand(Mode::Serial, args.into(), item.into()).into()
}

/// Runs the test beside others holding `name` through `parallel`, never
/// beside one holding it through `serial`, in this process or another. The
/// attribute form of `leasehold::testing::parallel`.
///
/// Arguments and placement as for [`serial`](macro@serial).
///
/// # Examples
///
/// In a test suite:
///
/// ```no_run
/// #[leasehold::parallel(database)]
/// #[tokio::test]
/// async fn reads_the_database() {
///     // ... other `parallel(database)` tests may run now, no `serial` one ...
/// }
/// # fn main() {}
/// ```
///
/// Called by hand:
///
/// ```
/// use leasehold::testing::{blocking_is_held, blocking_serial};
///
/// #[leasehold::parallel("parallel-doc-example")]
/// async fn read() -> bool {
///     leasehold::testing::is_held("parallel-doc-example").await
/// }
///
/// fn main() {
///     let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
///     assert!(runtime.block_on(read()));
///     // Two at once do not wait for each other.
///     let (a, b) = runtime.block_on(async { tokio::join!(read(), read()) });
///     assert!(a && b);
///     drop(blocking_serial("parallel-doc-example")); // all let go
///     assert!(!blocking_is_held("parallel-doc-example"));
/// }
/// ```
#[proc_macro_attribute]
pub fn parallel(args: proc_macro::TokenStream, item: proc_macro::TokenStream) -> proc_macro::TokenStream {
    expand(Mode::Parallel, args.into(), item.into()).into()
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    Serial,
    Parallel,
}

impl Mode {
    fn attribute(self) -> &'static str {
        match self {
            Mode::Serial => "serial",
            Mode::Parallel => "parallel",
        }
    }

    /// The `leasehold::testing` function that takes the lock.
    fn function(self, is_async: bool) -> Ident {
        let name = match (self, is_async) {
            (Mode::Serial, true) => "serial",
            (Mode::Serial, false) => "blocking_serial",
            (Mode::Parallel, true) => "parallel",
            (Mode::Parallel, false) => "blocking_parallel",
        };
        Ident::new(name, Span::call_site())
    }
}

/// The function the attribute is on, its body left unparsed: only where
/// the body starts matters, and a body that does not compile is then
/// reported by the compiler as written, not as this crate's error.
struct Function {
    attrs: Vec<Attribute>,
    vis: Visibility,
    sig: Signature,
    inner_attrs: Vec<Attribute>,
    body: TokenStream,
}

fn parse_function(input: ParseStream) -> syn::Result<Function> {
    let attrs = input.call(Attribute::parse_outer)?;
    let vis: Visibility = input.parse()?;
    let sig: Signature = input.parse()?;
    let content;
    braced!(content in input);
    let inner_attrs = content.call(Attribute::parse_inner)?;
    let body: TokenStream = content.parse()?;
    Ok(Function {
        attrs,
        vis,
        sig,
        inner_attrs,
        body,
    })
}

/// The lock name: one identifier or one non-empty string literal.
fn parse_name(mode: Mode, args: TokenStream) -> syn::Result<String> {
    let attribute = mode.attribute();
    let usage =
        format!("write `#[leasehold::{attribute}(database)]` or `#[leasehold::{attribute}(\"db-1\")]`");
    let parser = |input: ParseStream| -> syn::Result<String> {
        if input.is_empty() {
            return Err(syn::Error::new(
                Span::call_site(),
                format!("`#[leasehold::{attribute}]` needs the name of the lock to hold: {usage}"),
            ));
        }
        let name = if input.peek(LitStr) {
            let lit: LitStr = input.parse()?;
            if lit.value().is_empty() {
                return Err(syn::Error::new(
                    lit.span(),
                    format!("the lock name of `#[leasehold::{attribute}]` is empty: {usage}"),
                ));
            }
            lit.value()
        } else if input.peek(Ident::peek_any) {
            input.call(Ident::parse_any)?.unraw().to_string()
        } else {
            return Err(input.error(format!(
                "`#[leasehold::{attribute}]` takes a lock name, an identifier or a string literal: {usage}"
            )));
        };
        if !input.is_empty() {
            return Err(input.error(format!(
                "`#[leasehold::{attribute}]` takes one lock name, and nothing after it: {usage}; \
                 to hold several names, put one attribute per name, in the same order on every test"
            )));
        }
        Ok(name)
    };
    parser.parse2(args)
}

fn expand(mode: Mode, args: TokenStream, item: TokenStream) -> TokenStream {
    match try_expand(mode, args, item.clone()) {
        Ok(tokens) => tokens,
        // The item stays as written, so the only error is this one (not
        // also "cannot find function" wherever it is used).
        Err(error) => {
            let mut tokens = error.to_compile_error();
            tokens.extend(item);
            tokens
        }
    }
}

fn try_expand(mode: Mode, args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let name = parse_name(mode, args)?;
    let attribute = mode.attribute();
    let function = parse_function.parse2(item).map_err(|error| {
        syn::Error::new(
            error.span(),
            format!(
                "`#[leasehold::{attribute}]` goes on a function (a `#[test]` or an \
                 async `#[tokio::test]` one): {error}"
            ),
        )
    })?;
    if let Some(constness) = function.sig.constness {
        return Err(syn::Error::new(
            constness.span,
            format!("`#[leasehold::{attribute}]` cannot go on a `const fn`: taking a lock is not const"),
        ));
    }
    let is_async = function.sig.asyncness.is_some();
    let take = mode.function(is_async);
    let wait = is_async.then(|| quote!(.await));
    // Hygienic: the test's own code neither sees nor clashes with it.
    let guard = Ident::new("_leasehold_guard", Span::mixed_site());
    let Function {
        attrs,
        vis,
        sig,
        inner_attrs,
        body,
    } = function;
    let mut tokens = TokenStream::new();
    for attr in &attrs {
        attr.to_tokens(&mut tokens);
    }
    tokens.extend(quote! {
        #vis #sig {
            #(#inner_attrs)*
            let #guard = ::leasehold::testing::#take(#name) #wait;
            #body
        }
    });
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::{Mode, expand};
    use quote::quote;

    fn expanded(mode: Mode, args: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> String {
        expand(mode, args, item).to_string()
    }

    #[test]
    fn a_sync_function_takes_the_blocking_form() {
        let out = expanded(
            Mode::Serial,
            quote!(database),
            quote!(
                #[test]
                fn t() -> Result<(), E> {
                    work()?;
                    Ok(())
                }
            ),
        );
        assert!(
            out.starts_with("# [test] fn t () -> Result < () , E > {"),
            "{out}"
        );
        assert!(
            out.contains(
                "let _leasehold_guard = :: leasehold :: testing :: blocking_serial (\"database\") ;"
            ),
            "{out}"
        );
        assert!(out.ends_with("work () ? ; Ok (()) }"), "{out}");
    }

    #[test]
    fn an_async_function_awaits_the_async_form() {
        let out = expanded(
            Mode::Parallel,
            quote!("db-1"),
            quote!(
                #[tokio::test]
                async fn t() {
                    work().await
                }
            ),
        );
        assert!(
            out.contains(":: leasehold :: testing :: parallel (\"db-1\") . await ;"),
            "{out}"
        );
    }

    #[test]
    fn inner_attributes_stay_first_and_raw_identifiers_lose_their_prefix() {
        let out = expanded(
            Mode::Serial,
            quote!(r#type),
            quote!(
                fn t() {
                    #![allow(unused)]
                    let x = 1;
                }
            ),
        );
        let allow = out.find("# ! [allow (unused)]").expect(&out);
        let take = out.find("blocking_serial (\"type\")").expect(&out);
        assert!(allow < take, "{out}");
    }

    #[test]
    fn bad_arguments_are_compile_errors_with_the_item_kept() {
        for (args, message) in [
            (quote!(), "needs the name of the lock to hold"),
            (quote!(""), "is empty"),
            (quote!(42), "takes a lock name, an identifier or a string literal"),
            (quote!(a::b), "takes one lock name, and nothing after it"),
            (quote!(a, b), "takes one lock name, and nothing after it"),
            (quote!(name = "db"), "takes one lock name, and nothing after it"),
        ] {
            let out = expanded(
                Mode::Serial,
                args.clone(),
                quote!(
                    #[test]
                    fn kept() {}
                ),
            );
            assert!(out.contains("compile_error"), "{args}: {out}");
            assert!(out.contains(message), "{args}: {out}");
            assert!(
                out.contains("write `#[leasehold::serial(database)]`"),
                "{args}: {out}"
            );
            assert!(out.ends_with("# [test] fn kept () { }"), "{args}: {out}");
        }
    }

    #[test]
    fn only_functions_are_accepted() {
        for item in [
            quote!(
                struct S;
            ),
            quote!(
                const fn f() {}
            ),
            quote!(
                mod m {}
            ),
        ] {
            let out = expanded(Mode::Parallel, quote!(db), item.clone());
            assert!(out.contains("compile_error"), "{item}: {out}");
            assert!(out.contains("`#[leasehold::parallel]`"), "{item}: {out}");
        }
    }
}
