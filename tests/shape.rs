//! The crate's shape, measured from its syntax (syn), so a restructuring has before/after figures
//! and the figures cannot silently grow back: pub items and fields, long functions, type names
//! defined in more than one module, the places that build `WorkloadSignals`/`Snapshot` fixtures
//! or temp dirs by hand, and the size of `src/sample/`.
//!
//! `cargo test --test shape -- --nocapture` prints the table. The counts are held under the
//! ceilings below (a ratchet): a count above its ceiling fails with what grew; a count below it
//! passes and prints a hint to lower the ceiling, so the gain is kept.
//!
//! Production code is what the crates compile without `cfg(test)`: the module trees from each
//! crate root, `mod x;` resolved as rustc does (`#[path]` included), with `#[cfg(test)]` modules,
//! items and the files they load left out. Visibility is counted as written: a `pub` item in a
//! private module still counts as `pub`, since making it narrower is what a restructuring does.

use proc_macro2::{Delimiter, Span, TokenStream, TokenTree};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Component, Path, PathBuf};
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Attribute, Expr, ImplItem, Item, Meta, Token, TraitItem, UseTree, Visibility};

/// A function is long from this many lines, counted from its `fn` line to its closing brace.
const LONG_FN_LINES: usize = 80;

// Ceilings: today's counts. Lower one when a change brings its count down (the test says so).
// Not held: the pub(crate)/pub(super) count (narrowing `pub` raises it, as intended) and the
// number of files under src/sample/ (a sampler is a folder of several).

/// Production items of `src/` whose visibility is exactly `pub` (fns, methods, assoc consts,
/// types, traits, consts, statics, mods, each name a `pub use` re-exports).
const MAX_PUB_ITEMS: usize = 1123;
/// Named fields of production structs of `src/` that are exactly `pub`.
const MAX_PUB_FIELDS: usize = 835;
/// Production functions and methods of `src/` of `LONG_FN_LINES` lines or more.
const MAX_LONG_FNS: usize = 28;
/// Struct, enum, union, trait and type alias names defined in more than one production module.
const MAX_DUPLICATE_TYPE_NAMES: usize = 24;
/// `WorkloadSignals { .. }` and `Snapshot { .. }` literals in test code (src test modules,
/// tests/, benches/): each is a fixture a field change has to visit.
const MAX_FIXTURE_LITERALS: usize = 14;
/// Files of test code that make a temp dir themselves (`tempfile::tempdir`, `TempDir::new`,
/// `Builder::new().tempdir()`).
const MAX_TEMPDIR_FILES: usize = 31;
/// Production `pub` items under `src/sample/`.
const MAX_SAMPLE_PUB_ITEMS: usize = 296;

/// The long functions of today, by qualified name (`Type::method`, `outer::inner`), without their
/// file so that moving one is no failure. Only used to name the newcomer when `MAX_LONG_FNS` is
/// exceeded.
const KNOWN_LONG_FNS: &[&str] = &[
    "Agent::with_actuators",
    "Config::from_yaml_with",
    "Decider::reconfigure",
    "Decider::restore",
    "Decider::settle_hold",
    "Decider::trip",
    "Enforcer::hold",
    "Layout::new",
    "LogTailer::reconcile",
    "ProcessSampler::sample",
    "SocketCache::sample_keyed",
    "Tracker::update",
    "View::build",
    "ZombieTracker::tick",
    "check_alerts",
    "check_config",
    "check_daemonset",
    "check_probe",
    "compile",
    "default_rules",
    "main",
    "rows",
    "run",
    "status",
    "storm",
    "text",
    "to_text",
];

/// The duplicated type names of today; only used to name the newcomer when
/// `MAX_DUPLICATE_TYPE_NAMES` is exceeded.
const KNOWN_DUPLICATE_TYPE_NAMES: &[&str] = &[
    "Agent",
    "Breaker",
    "Command",
    "Discovery",
    "Family",
    "Feature",
    "Guard",
    "Held",
    "Kept",
    "Key",
    "Kind",
    "KmsgSampler",
    "Known",
    "Label",
    "NodeConntrack",
    "Reader",
    "Report",
    "Row",
    "Rule",
    "Sampler",
    "Samplers",
    "Target",
    "Tree",
    "Workload",
];

/// The struct literals counted as fixture places.
const FIXTURE_TYPES: [&str; 2] = ["WorkloadSignals", "Snapshot"];

/// The library crate's name, the first segment of its module paths.
const LIB: &str = "nodeguard";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `p` relative to the package, with `/` separators, for messages and the table.
fn rel(p: &Path) -> String {
    let r = p.strip_prefix(root()).unwrap_or(p);
    r.components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

/// `a/b/../c` as `a/c`: a `#[path]` may climb, and a file must have one key however reached.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// Every `.rs` file under `dir`, sorted. Data trees (`tests/fixtures/`, `tests/vm/`) and any
/// `target/` are not code of the crate.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", rel(dir)));
    for e in entries {
        let p = e
            .unwrap_or_else(|e| panic!("read {}: {e}", rel(dir)))
            .path();
        if p.is_dir() {
            let r = rel(&p);
            if r == "tests/fixtures" || r == "tests/vm" || p.ends_with("target") {
                continue;
            }
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
}

/// Which `pub` an item carries.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Vis {
    Pub,
    Crate,
    Super,
    /// `pub(in path)` and `pub(self)`.
    In,
}

fn vis_of(v: &Visibility) -> Option<Vis> {
    match v {
        Visibility::Public(_) => Some(Vis::Pub),
        Visibility::Restricted(r) if r.in_token.is_none() && r.path.is_ident("crate") => {
            Some(Vis::Crate)
        }
        Visibility::Restricted(r) if r.in_token.is_none() && r.path.is_ident("super") => {
            Some(Vis::Super)
        }
        Visibility::Restricted(_) => Some(Vis::In),
        Visibility::Inherited => None,
    }
}

/// The item exists only in test builds: `cfg(test)`, `cfg(all(.., test, ..))`, or `cfg(any(..))`
/// of such terms only (`cfg(any(test, x))` is compiled into the agent wherever `x` holds).
fn cfg_needs_test(meta: &Meta) -> bool {
    match meta {
        Meta::Path(p) => p.is_ident("test"),
        Meta::List(l) if l.path.is_ident("all") => l
            .parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)
            .is_ok_and(|terms| terms.iter().any(cfg_needs_test)),
        Meta::List(l) if l.path.is_ident("any") => l
            .parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)
            .is_ok_and(|terms| !terms.is_empty() && terms.iter().all(cfg_needs_test)),
        _ => false,
    }
}

fn is_cfg_test(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<Meta>().is_ok_and(|m| cfg_needs_test(&m))
    })
}

/// The value of `#[path = "..."]`, if the item has one.
fn path_attr(attrs: &[Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// The names a `use` tree brings in: `pub use a::{b, c as d, e::*}` re-exports three.
fn use_names(tree: &UseTree) -> usize {
    match tree {
        UseTree::Path(p) => use_names(&p.tree),
        UseTree::Name(_) | UseTree::Rename(_) | UseTree::Glob(_) => 1,
        UseTree::Group(g) => g.items.iter().map(use_names).sum(),
    }
}

/// The last segment of a type's path: `Snapshot` for `crate::model::Snapshot`, `Foo` for `Foo<T>`.
fn type_name(ty: &syn::Type) -> Option<String> {
    match ty {
        syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        _ => None,
    }
}

/// One counted item or field: its file, its row of the table, and its `pub`.
struct PubItem {
    file: String,
    group: String,
    vis: Vis,
}

struct LongFn {
    name: String,
    file: String,
    line: usize,
    lines: usize,
}

/// Per file: `WorkloadSignals` literals, `Snapshot` literals, how many of them in test code.
#[derive(Default, Clone, Copy)]
struct Literals {
    signals: usize,
    snapshot: usize,
    in_tests: usize,
}

/// Everything measured.
#[derive(Default)]
struct Shape {
    /// Every `.rs` file walked: path and whether only tests compile it.
    files: BTreeMap<String, bool>,
    /// The crates of `src/` and the top-level module of each production file, for the table.
    groups: BTreeMap<String, String>,
    pub_items: Vec<PubItem>,
    /// Items counted by kind (`fn`, `method`, `struct`, ..), exactly `pub` only.
    pub_kinds: BTreeMap<&'static str, usize>,
    pub_fields: Vec<PubItem>,
    /// `pub(..)` named fields and `pub` tuple fields: shown, not held by a ceiling.
    restricted_fields: usize,
    pub_tuple_fields: usize,
    long_fns: Vec<LongFn>,
    /// Type name -> the modules defining it (production only).
    type_names: BTreeMap<String, BTreeSet<String>>,
    literals: BTreeMap<String, Literals>,
    /// File -> temp dirs it makes itself.
    tempdirs: BTreeMap<String, usize>,
    /// Whatever makes the measurement wrong: unparsable or unresolvable files.
    errors: Vec<String>,
}

/// A file to walk, in the module it is loaded as.
struct Job {
    path: PathBuf,
    /// `nodeguard::action::decide`, `bin/testload::net`; for tests/ and benches/ the file itself.
    module: Vec<String>,
    /// What the file counts under in the table: the top-level module or the binary.
    group: String,
    /// Loaded only by a `#[cfg(test)]` module (or is tests/, benches/ code).
    test: bool,
    /// Where its `mod x;` declarations are looked for (rustc's module directory).
    child_dir: PathBuf,
    /// Only `src/` is walked as module trees; tests/ and benches/ are walked file by file.
    follow_mods: bool,
}

/// Walks one file: counts into `shape`, and queues the files its `mod x;` declarations load.
struct Walker<'a> {
    shape: &'a mut Shape,
    jobs: &'a mut Vec<Job>,
    file: String,
    file_dir: PathBuf,
    group: String,
    follow_mods: bool,
    module: Vec<String>,
    test: bool,
    child_dir: PathBuf,
    /// Depth in inline `mod x { .. }` blocks: a `#[path]` there is relative to `child_dir`.
    inline: usize,
    /// Enclosing functions by qualified name: items inside a body are not module items.
    fns: Vec<String>,
    /// The enclosing `impl` self type or trait, for `Type::method` and `Self { .. }`.
    owners: Vec<Option<String>>,
}

impl Walker<'_> {
    fn count(&mut self, vis: &Visibility, kind: &'static str, n: usize) {
        let Some(v) = vis_of(vis) else { return };
        if v == Vis::Pub {
            *self.shape.pub_kinds.entry(kind).or_default() += n;
        }
        for _ in 0..n {
            self.shape.pub_items.push(PubItem {
                file: self.file.clone(),
                group: self.group.clone(),
                vis: v,
            });
        }
    }

    fn type_defined(&mut self, name: &syn::Ident) {
        self.shape
            .type_names
            .entry(name.to_string())
            .or_default()
            .insert(self.module.join("::"));
    }

    /// Counts a module-level item of production code.
    fn count_item(&mut self, item: &Item) {
        match item {
            Item::Const(i) => self.count(&i.vis, "const", 1),
            Item::Enum(i) => {
                self.count(&i.vis, "enum", 1);
                self.type_defined(&i.ident);
            }
            Item::ExternCrate(i) => self.count(&i.vis, "extern crate", 1),
            Item::Fn(i) => self.count(&i.vis, "fn", 1),
            Item::ForeignMod(m) => {
                for fi in &m.items {
                    match fi {
                        syn::ForeignItem::Fn(f) => self.count(&f.vis, "fn", 1),
                        syn::ForeignItem::Static(s) => self.count(&s.vis, "static", 1),
                        syn::ForeignItem::Type(t) => self.count(&t.vis, "type", 1),
                        _ => {}
                    }
                }
            }
            Item::Mod(i) => self.count(&i.vis, "mod", 1),
            Item::Static(i) => self.count(&i.vis, "static", 1),
            Item::Struct(i) => {
                self.count(&i.vis, "struct", 1);
                self.type_defined(&i.ident);
                self.count_fields(&i.fields);
            }
            Item::Trait(i) => {
                self.count(&i.vis, "trait", 1);
                self.type_defined(&i.ident);
            }
            Item::TraitAlias(i) => self.count(&i.vis, "trait", 1),
            Item::Type(i) => {
                self.count(&i.vis, "type", 1);
                self.type_defined(&i.ident);
            }
            Item::Union(i) => {
                self.count(&i.vis, "union", 1);
                self.type_defined(&i.ident);
            }
            Item::Use(i) => self.count(&i.vis, "use (names)", use_names(&i.tree)),
            _ => {}
        }
    }

    fn count_fields(&mut self, fields: &syn::Fields) {
        for f in fields {
            if is_cfg_test(&f.attrs) {
                continue;
            }
            match (vis_of(&f.vis), f.ident.is_some()) {
                (Some(Vis::Pub), true) => self.shape.pub_fields.push(PubItem {
                    file: self.file.clone(),
                    group: self.group.clone(),
                    vis: Vis::Pub,
                }),
                (Some(Vis::Pub), false) => self.shape.pub_tuple_fields += 1,
                (Some(_), true) => self.shape.restricted_fields += 1,
                _ => {}
            }
        }
    }

    /// `name` qualified by the enclosing function or `impl`/trait.
    fn qualified(&self, name: &syn::Ident, in_owner: bool) -> String {
        let own = match self.owners.last() {
            Some(Some(o)) if in_owner => format!("{o}::{name}"),
            _ => name.to_string(),
        };
        match self.fns.last() {
            Some(outer) => format!("{outer}::{own}"),
            None => own,
        }
    }

    /// Visits a function body, recording it when it is long production code.
    fn function(&mut self, name: String, fn_token: Span, block: &syn::Block) {
        let start = fn_token.start().line;
        let end = block.brace_token.span.close().end().line;
        let lines = end.saturating_sub(start) + 1;
        if !self.test && lines >= LONG_FN_LINES {
            self.shape.long_fns.push(LongFn {
                name: name.clone(),
                file: self.file.clone(),
                line: start,
                lines,
            });
        }
        self.fns.push(name);
        self.visit_block(block);
        self.fns.pop();
    }

    fn literal(&mut self, name: &str) {
        let l = self.shape.literals.entry(self.file.clone()).or_default();
        if name == FIXTURE_TYPES[0] {
            l.signals += 1;
        } else {
            l.snapshot += 1;
        }
        if self.test {
            l.in_tests += 1;
        }
    }

    /// The fixture type a struct literal's path names (`Self` resolved through the `impl`).
    fn fixture_type(&self, last: &str) -> Option<&'static str> {
        let name = match (last, self.owners.last()) {
            ("Self", Some(Some(owner))) => owner.as_str(),
            _ => last,
        };
        FIXTURE_TYPES.into_iter().find(|t| *t == name)
    }

    fn temp_dir_made(&mut self) {
        *self.shape.tempdirs.entry(self.file.clone()).or_default() += 1;
    }

    /// Resolves `mod name;` as rustc does and queues the file.
    fn load(&mut self, m: &syn::ItemMod, test: bool) {
        let name = m.ident.to_string();
        let (path, child_dir) = if let Some(p) = path_attr(&m.attrs) {
            // Outside inline modules a `#[path]` is relative to the declaring file's directory;
            // inside them to the module directory. The loaded file owns its directory like a
            // mod.rs: its own `mod` declarations are looked for beside it.
            let base = if self.inline == 0 {
                &self.file_dir
            } else {
                &self.child_dir
            };
            let path = normalize(&base.join(p));
            let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
            (path, dir)
        } else {
            let flat = self.child_dir.join(format!("{name}.rs"));
            let nested = self.child_dir.join(&name).join("mod.rs");
            match (flat.is_file(), nested.is_file()) {
                (true, false) => (flat, self.child_dir.join(&name)),
                (false, true) => (nested, self.child_dir.join(&name)),
                (both, _) => {
                    let why = if both { "both" } else { "neither" };
                    self.shape.errors.push(format!(
                        "{}: `mod {name};` finds {why} of {} and {}",
                        self.file,
                        rel(&flat),
                        rel(&nested)
                    ));
                    return;
                }
            }
        };
        // The library's files count under their top-level module, a binary's under the binary.
        let group = if self.module.len() == 1 && self.module[0] == LIB {
            name.clone()
        } else {
            self.group.clone()
        };
        let mut module = self.module.clone();
        module.push(name);
        self.jobs.push(Job {
            path,
            module,
            group,
            test,
            child_dir,
            follow_mods: true,
        });
    }

    /// A macro's body is tokens to syn. Bodies that are expressions (`vec![..]`, `assert_eq!(..)`,
    /// `format!(..)`) are parsed and walked; any other body is scanned token by token, so a
    /// fixture built inside a macro is still counted.
    fn macro_body(&mut self, mac: &syn::Macro) {
        let exprs = mac
            .parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated)
            .map(|p| p.into_iter().collect::<Vec<_>>())
            .or_else(|_| {
                mac.parse_body_with(|input: syn::parse::ParseStream| {
                    // `vec![elem; n]`
                    let elem: Expr = input.parse()?;
                    input.parse::<Token![;]>()?;
                    let n: Expr = input.parse()?;
                    Ok(vec![elem, n])
                })
            });
        match exprs {
            Ok(exprs) => {
                for e in &exprs {
                    self.visit_expr(e);
                }
            }
            Err(_) => self.scan_tokens(mac.tokens.clone()),
        }
    }

    /// The token-level fallback: `Name { .. }` with `Name` a fixture type (not after `struct`,
    /// `impl`, `for` or `->`, and not a `{ .. }` pattern), and `tempdir(`, `tempdir_in(`,
    /// `TempDir::new(`.
    fn scan_tokens(&mut self, tokens: TokenStream) {
        let tts: Vec<TokenTree> = tokens.into_iter().collect();
        for (k, tt) in tts.iter().enumerate() {
            match tt {
                TokenTree::Group(g) => self.scan_tokens(g.stream()),
                TokenTree::Ident(id) => {
                    let next = tts.get(k + 1);
                    let s = id.to_string();
                    if let Some(TokenTree::Group(g)) = next {
                        let prev = k.checked_sub(1).and_then(|p| tts.get(p));
                        let declares = match prev {
                            Some(TokenTree::Ident(p)) => {
                                matches!(p.to_string().as_str(), "struct" | "impl" | "for")
                            }
                            Some(TokenTree::Punct(p)) => p.as_char() == '>',
                            _ => false,
                        };
                        let body: Vec<String> =
                            g.stream().into_iter().map(|t| t.to_string()).collect();
                        let pattern = body.len() >= 2 && body[body.len() - 2..] == [".", "."];
                        if g.delimiter() == Delimiter::Brace && !declares && !pattern {
                            if let Some(t) = self.fixture_type(&s) {
                                self.literal(t);
                            }
                        }
                        let call = g.delimiter() == Delimiter::Parenthesis;
                        if call && (s == "tempdir" || s == "tempdir_in") {
                            self.temp_dir_made();
                        }
                        let via_tempdir =
                            k >= 3 && matches!(&tts[k - 3], TokenTree::Ident(t) if t == "TempDir");
                        if call && via_tempdir && is_tempdir_ctor(&s) {
                            self.temp_dir_made();
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

/// `TempDir`'s constructors: each makes a directory.
fn is_tempdir_ctor(name: &str) -> bool {
    matches!(
        name,
        "new" | "new_in" | "with_prefix" | "with_prefix_in" | "with_suffix" | "with_suffix_in"
    )
}

impl<'ast> Visit<'ast> for Walker<'_> {
    fn visit_item(&mut self, item: &'ast Item) {
        let outer = self.test;
        self.test |= is_cfg_test(item_attrs(item));
        if !self.test && self.fns.is_empty() {
            self.count_item(item);
        }
        visit::visit_item(self, item);
        self.test = outer;
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        // `self.test` already says whether this module is `#[cfg(test)]` (visit_item).
        match &m.content {
            Some((_, items)) => {
                let dir = match path_attr(&m.attrs) {
                    Some(p) => self.child_dir.join(p),
                    None => self.child_dir.join(m.ident.to_string()),
                };
                let outer_dir = std::mem::replace(&mut self.child_dir, dir);
                self.module.push(m.ident.to_string());
                self.inline += 1;
                for item in items {
                    self.visit_item(item);
                }
                self.inline -= 1;
                self.module.pop();
                self.child_dir = outer_dir;
            }
            None if self.follow_mods => self.load(m, self.test),
            None => {}
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        let name = self.qualified(&f.sig.ident, false);
        self.function(name, f.sig.fn_token.span, &f.block);
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        self.owners.push(type_name(&i.self_ty));
        for item in &i.items {
            self.visit_impl_item(item);
        }
        self.owners.pop();
    }

    fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
        self.owners.push(Some(t.ident.to_string()));
        for item in &t.items {
            self.visit_trait_item(item);
        }
        self.owners.pop();
    }

    fn visit_impl_item(&mut self, item: &'ast ImplItem) {
        let attrs: &[Attribute] = match item {
            ImplItem::Const(c) => &c.attrs,
            ImplItem::Fn(f) => &f.attrs,
            ImplItem::Type(t) => &t.attrs,
            ImplItem::Macro(m) => &m.attrs,
            _ => &[],
        };
        let outer = self.test;
        self.test |= is_cfg_test(attrs);
        if !self.test && self.fns.is_empty() {
            match item {
                ImplItem::Const(c) => self.count(&c.vis, "assoc const", 1),
                ImplItem::Fn(f) => self.count(&f.vis, "method", 1),
                ImplItem::Type(t) => self.count(&t.vis, "assoc type", 1),
                _ => {}
            }
        }
        visit::visit_impl_item(self, item);
        self.test = outer;
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        let name = self.qualified(&f.sig.ident, true);
        self.function(name, f.sig.fn_token.span, &f.block);
    }

    fn visit_trait_item(&mut self, item: &'ast TraitItem) {
        let attrs: &[Attribute] = match item {
            TraitItem::Const(c) => &c.attrs,
            TraitItem::Fn(f) => &f.attrs,
            TraitItem::Type(t) => &t.attrs,
            TraitItem::Macro(m) => &m.attrs,
            _ => &[],
        };
        let outer = self.test;
        self.test |= is_cfg_test(attrs);
        visit::visit_trait_item(self, item);
        self.test = outer;
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            let name = self.qualified(&f.sig.ident, true);
            self.function(name, f.sig.fn_token.span, block);
        }
    }

    fn visit_expr_struct(&mut self, e: &'ast syn::ExprStruct) {
        // `Name { a, .. }` without a base is a destructuring assignment, not a value built.
        let destructures = e.dot2_token.is_some() && e.rest.is_none();
        if let Some(last) = e.path.segments.last() {
            if let Some(t) = self.fixture_type(&last.ident.to_string()) {
                if !destructures {
                    self.literal(t);
                }
            }
        }
        visit::visit_expr_struct(self, e);
    }

    fn visit_expr_call(&mut self, c: &'ast syn::ExprCall) {
        if let Expr::Path(p) = &*c.func {
            let segs: Vec<String> = p
                .path
                .segments
                .iter()
                .map(|s| s.ident.to_string())
                .collect();
            let last = segs.last().map_or("", String::as_str);
            let before = segs.len().checked_sub(2).map_or("", |k| segs[k].as_str());
            if last == "tempdir"
                || last == "tempdir_in"
                || (before == "TempDir" && is_tempdir_ctor(last))
            {
                self.temp_dir_made();
            }
        }
        visit::visit_expr_call(self, c);
    }

    fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
        // `tempfile::Builder::new().prefix(..).tempdir()`
        if m.method == "tempdir" || m.method == "tempdir_in" {
            self.temp_dir_made();
        }
        visit::visit_expr_method_call(self, m);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.macro_body(mac);
    }
}

/// A file's syntax tree, or why not as `file:line:column: ...`. A file that does not parse is an
/// error, never skipped: the figures would silently miss it.
fn parse(path: &Path) -> Result<syn::File, String> {
    let file = rel(path);
    let text = std::fs::read_to_string(path).map_err(|e| format!("{file}: {e}"))?;
    syn::parse_file(&text).map_err(|e| {
        let at = e.span().start();
        format!("{file}:{}:{}: does not parse: {e}", at.line, at.column + 1)
    })
}

/// Parses and walks `job`'s file, queueing what it loads.
fn walk(shape: &mut Shape, jobs: &mut Vec<Job>, job: Job) {
    let file = rel(&job.path);
    if shape.files.insert(file.clone(), job.test).is_some() {
        shape.errors.push(format!(
            "{file} is loaded twice (by `mod` or `#[path]`): the figures assume one module per file"
        ));
        return;
    }
    let ast = match parse(&job.path) {
        Ok(a) => a,
        Err(e) => return shape.errors.push(e),
    };
    if !job.test && job.follow_mods {
        shape.groups.insert(file.clone(), job.group.clone());
    }
    let mut w = Walker {
        shape,
        jobs,
        file_dir: job.path.parent().map(Path::to_path_buf).unwrap_or_default(),
        file,
        group: job.group,
        follow_mods: job.follow_mods,
        module: job.module,
        test: job.test,
        child_dir: job.child_dir,
        inline: 0,
        fns: Vec::new(),
        owners: Vec::new(),
    };
    // An inner `#![cfg(test)]` makes the whole file test code.
    w.test |= is_cfg_test(&ast.attrs);
    w.visit_file(&ast);
}

/// The crate roots of `src/` (lib, main, each binary under `src/bin/`), as jobs.
fn crate_roots(src: &Path) -> Vec<Job> {
    let mut roots = Vec::new();
    let mut root = |path: PathBuf, name: String| {
        let child_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        // The library root's own items count under its file name; its modules under their names.
        let group = if name == LIB {
            "lib.rs".into()
        } else {
            name.clone()
        };
        roots.push(Job {
            path,
            module: vec![name],
            group,
            test: false,
            child_dir,
            follow_mods: true,
        });
    };
    if src.join("lib.rs").is_file() {
        root(src.join("lib.rs"), LIB.into());
    }
    if src.join("main.rs").is_file() {
        root(src.join("main.rs"), "main.rs".into());
    }
    let mut bins: Vec<PathBuf> = std::fs::read_dir(src.join("bin"))
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    bins.sort();
    for b in bins {
        let name = b
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if b.is_dir() && b.join("main.rs").is_file() {
            root(b.join("main.rs"), format!("bin/{name}"));
        } else if b.extension().is_some_and(|x| x == "rs") {
            root(b, format!("bin/{name}"));
        }
    }
    roots
}

fn measure() -> Shape {
    let mut shape = Shape::default();
    let src = root().join("src");
    let mut jobs = crate_roots(&src);
    jobs.reverse();
    while let Some(job) = jobs.pop() {
        let mut found = Vec::new();
        walk(&mut shape, &mut found, job);
        // Depth-first in declaration order: children before the next sibling.
        jobs.extend(found.into_iter().rev());
    }
    // Every file of src/ must have been reached from a crate root: one that is not is compiled
    // by nothing, and the figures would not say so.
    let mut all = Vec::new();
    rust_files(&src, &mut all);
    for p in &all {
        if !shape.files.contains_key(&rel(p)) {
            // Parsed all the same, so that a broken one is named as such too.
            if let Err(e) = parse(p) {
                shape.errors.push(e);
            }
            shape.errors.push(format!(
                "{} is reached from no crate root (no `mod` loads it): load it or delete it",
                rel(p)
            ));
        }
    }
    // tests/ and benches/: all test code, each file walked once whoever `#[path]`s it.
    for dir in ["tests", "benches"] {
        let mut files = Vec::new();
        rust_files(&root().join(dir), &mut files);
        for path in files {
            let module = vec![rel(&path)];
            let child_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
            let mut none = Vec::new();
            walk(
                &mut shape,
                &mut none,
                Job {
                    path,
                    module,
                    group: dir.into(),
                    test: true,
                    child_dir,
                    follow_mods: false,
                },
            );
        }
    }
    shape
}

/// Long functions, longest first.
fn long_fns(s: &Shape) -> Vec<&LongFn> {
    let mut v: Vec<&LongFn> = s.long_fns.iter().collect();
    v.sort_by(|a, b| {
        b.lines
            .cmp(&a.lines)
            .then_with(|| (&a.file, a.line).cmp(&(&b.file, b.line)))
    });
    v
}

/// Type names defined in more than one production module, with those modules.
fn duplicates(s: &Shape) -> Vec<(&String, &BTreeSet<String>)> {
    s.type_names.iter().filter(|(_, m)| m.len() > 1).collect()
}

fn sample_files(s: &Shape) -> (usize, usize) {
    let files = s.files.iter().filter(|(f, _)| f.starts_with("src/sample/"));
    let (mut production, mut test) = (0, 0);
    for (_, &is_test) in files {
        if is_test {
            test += 1;
        } else {
            production += 1;
        }
    }
    (production, test)
}

/// The figures the ceilings hold.
struct Counts {
    pub_items: usize,
    pub_restricted: usize,
    pub_fields: usize,
    long_fns: usize,
    duplicate_type_names: usize,
    fixture_literals: usize,
    tempdir_files: usize,
    sample_files: usize,
    sample_pub_items: usize,
}

fn counts(s: &Shape) -> Counts {
    let pubs = |f: &dyn Fn(&PubItem) -> bool| s.pub_items.iter().filter(|p| f(p)).count();
    let (sp, st) = sample_files(s);
    Counts {
        pub_items: pubs(&|p| p.vis == Vis::Pub),
        pub_restricted: pubs(&|p| p.vis != Vis::Pub),
        pub_fields: s.pub_fields.len(),
        long_fns: s.long_fns.len(),
        duplicate_type_names: duplicates(s).len(),
        fixture_literals: s.literals.values().map(|l| l.in_tests).sum(),
        tempdir_files: s.tempdirs.len(),
        sample_files: sp + st,
        sample_pub_items: pubs(&|p| p.vis == Vis::Pub && p.file.starts_with("src/sample/")),
    }
}

/// The readable table of everything measured.
fn table(s: &Shape) -> String {
    let c = counts(s);
    let mut t = String::new();
    let production = s
        .files
        .iter()
        .filter(|(f, test)| f.starts_with("src/") && !**test)
        .count();
    let src_test = s
        .files
        .iter()
        .filter(|(f, test)| f.starts_with("src/") && **test)
        .count();
    let other = |d: &str| s.files.keys().filter(|f| f.starts_with(d)).count();
    let _ = writeln!(t, "\n=== nodeguard shape (tests/shape.rs) ===");
    let _ = writeln!(
        t,
        "files: src/ {} ({production} production, {src_test} test-only), tests/ {}, benches/ {}",
        production + src_test,
        other("tests/"),
        other("benches/")
    );

    let _ = writeln!(t, "\n--- 1. visibility, production src/ (as written) ---");
    let _ = writeln!(
        t,
        "{:<20} {:>5} {:>5} {:>10} {:>10} {:>7} {:>10}",
        "module", "files", "pub", "pub(crate)", "pub(super)", "pub(in)", "pub fields"
    );
    let mut groups: BTreeMap<&str, [usize; 6]> = BTreeMap::new();
    for g in s.groups.values() {
        groups.entry(g).or_default()[0] += 1;
    }
    for p in &s.pub_items {
        let col = match p.vis {
            Vis::Pub => 1,
            Vis::Crate => 2,
            Vis::Super => 3,
            Vis::In => 4,
        };
        groups.entry(&p.group).or_default()[col] += 1;
    }
    for f in &s.pub_fields {
        groups.entry(&f.group).or_default()[5] += 1;
    }
    let mut total = [0; 6];
    let row = |t: &mut String, name: &str, r: &[usize; 6]| {
        let _ = writeln!(
            t,
            "{name:<20} {:>5} {:>5} {:>10} {:>10} {:>7} {:>10}",
            r[0], r[1], r[2], r[3], r[4], r[5]
        );
    };
    for (g, r) in &groups {
        row(&mut t, g, r);
        for (sum, v) in total.iter_mut().zip(r) {
            *sum += v;
        }
    }
    row(&mut t, "total", &total);
    let kinds: Vec<String> = s
        .pub_kinds
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    let _ = writeln!(t, "pub by kind: {}", kinds.join(", "));
    let _ = writeln!(
        t,
        "pub items {} | pub(crate)/pub(super)/pub(in) {} | pub fields {} \
         (not held: pub(..) fields {}, pub tuple fields {})",
        c.pub_items, c.pub_restricted, c.pub_fields, s.restricted_fields, s.pub_tuple_fields
    );

    let _ = writeln!(
        t,
        "\n--- 2. functions of {LONG_FN_LINES}+ lines, production src/: {} ---",
        c.long_fns
    );
    for f in long_fns(s) {
        let _ = writeln!(t, "{:>5}  {:<48} {}:{}", f.lines, f.name, f.file, f.line);
    }

    let dups = duplicates(s);
    let _ = writeln!(
        t,
        "\n--- 3. type names defined in more than one production module: {} ---",
        dups.len()
    );
    for (name, modules) in &dups {
        let m: Vec<&str> = modules.iter().map(String::as_str).collect();
        let _ = writeln!(t, "{name:<28} {}", m.join(", "));
    }

    let _ = writeln!(t, "\n--- 4. fixture places ---");
    let _ = writeln!(
        t,
        "{:<40} {:>15} {:>9} {:>13}",
        "struct literals in", "WorkloadSignals", "Snapshot", "in test code"
    );
    let mut sum = Literals::default();
    for (file, l) in &s.literals {
        let _ = writeln!(
            t,
            "{file:<40} {:>15} {:>9} {:>13}",
            l.signals, l.snapshot, l.in_tests
        );
        sum.signals += l.signals;
        sum.snapshot += l.snapshot;
        sum.in_tests += l.in_tests;
    }
    let _ = writeln!(
        t,
        "{:<40} {:>15} {:>9} {:>13}",
        format!("total ({} files)", s.literals.len()),
        sum.signals,
        sum.snapshot,
        sum.in_tests
    );
    let _ = writeln!(t, "files making temp dirs themselves: {}", c.tempdir_files);
    for (file, n) in &s.tempdirs {
        let _ = writeln!(t, "  {file:<40} {n:>3} call(s)");
    }

    let (sp, st) = sample_files(s);
    let sample_restricted = s
        .pub_items
        .iter()
        .filter(|p| p.vis != Vis::Pub && p.file.starts_with("src/sample/"))
        .count();
    let sample_fields = s
        .pub_fields
        .iter()
        .filter(|p| p.file.starts_with("src/sample/"))
        .count();
    let _ = writeln!(t, "\n--- 5. src/sample/ ---");
    let _ = writeln!(
        t,
        ".rs files {} ({sp} production, {st} test-only) | pub items {} | \
         pub(crate)/pub(super)/pub(in) {sample_restricted} | pub fields {sample_fields}",
        c.sample_files, c.sample_pub_items
    );
    t
}

/// Compares each count with its ceiling: returns the failures, prints a hint for each count that
/// went down.
fn check(s: &Shape) -> Vec<String> {
    let c = counts(s);
    let new_long: Vec<String> = long_fns(s)
        .into_iter()
        .filter(|f| !KNOWN_LONG_FNS.contains(&f.name.as_str()))
        .map(|f| format!("{} at {}:{} ({} lines)", f.name, f.file, f.line, f.lines))
        .collect();
    let new_dup_names: Vec<String> = duplicates(s)
        .into_iter()
        .filter(|(n, _)| !KNOWN_DUPLICATE_TYPE_NAMES.contains(&n.as_str()))
        .map(|(n, m)| {
            format!(
                "{n} (in {})",
                m.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        })
        .collect();
    let long_over = if new_long.is_empty() {
        format!("a function grew to {LONG_FN_LINES} lines or more (section 2)")
    } else {
        format!(
            "a new function of {LONG_FN_LINES} lines or more: {}",
            new_long.join("; ")
        )
    };
    let new_dups = if new_dup_names.is_empty() {
        "see section 3".to_string()
    } else {
        new_dup_names.join("; ")
    };
    // (ceiling, count, its value, what grew and what to do)
    let checks: [(&str, usize, usize, String); 7] = [
        (
            "MAX_PUB_ITEMS",
            c.pub_items,
            MAX_PUB_ITEMS,
            "more `pub` items (per module in section 1): make the new ones pub(crate) or \
             private unless another module needs them"
                .into(),
        ),
        (
            "MAX_PUB_FIELDS",
            c.pub_fields,
            MAX_PUB_FIELDS,
            "more `pub` struct fields: a constructor or accessor keeps the struct's invariants \
             its own"
                .into(),
        ),
        (
            "MAX_LONG_FNS",
            c.long_fns,
            MAX_LONG_FNS,
            format!(
                "{long_over}. Split it; if it cannot be, add its name to KNOWN_LONG_FNS and \
                 raise MAX_LONG_FNS"
            ),
        ),
        (
            "MAX_DUPLICATE_TYPE_NAMES",
            c.duplicate_type_names,
            MAX_DUPLICATE_TYPE_NAMES,
            format!(
                "a type name now defined in more than one module: {new_dups}. Rename it, or add \
                 it to KNOWN_DUPLICATE_TYPE_NAMES and raise the ceiling"
            ),
        ),
        (
            "MAX_FIXTURE_LITERALS",
            c.fixture_literals,
            MAX_FIXTURE_LITERALS,
            "more WorkloadSignals/Snapshot literals in test code (section 4): build the fixture \
             in one shared place rather than by hand in another file"
                .into(),
        ),
        (
            "MAX_TEMPDIR_FILES",
            c.tempdir_files,
            MAX_TEMPDIR_FILES,
            "another file makes temp dirs itself (section 4): take them from a shared fixture"
                .into(),
        ),
        (
            "MAX_SAMPLE_PUB_ITEMS",
            c.sample_pub_items,
            MAX_SAMPLE_PUB_ITEMS,
            "more `pub` items under src/sample/".into(),
        ),
    ];
    let mut failures = Vec::new();
    for (name, count, ceiling, over) in checks {
        if count > ceiling {
            failures.push(format!("{name}: {count} > {ceiling}: {over}."));
        } else if count < ceiling {
            println!("hint: {name} is {ceiling} but the count is {count}: lower it to {count}");
        }
    }
    // Names only drift while the counts hold; say so, without failing.
    if c.long_fns <= MAX_LONG_FNS {
        for f in &new_long {
            println!("hint: {f} is long and not in KNOWN_LONG_FNS: add it");
        }
    }
    for k in KNOWN_LONG_FNS {
        if !s.long_fns.iter().any(|f| f.name == *k) {
            println!(
                "hint: {k} is no longer {LONG_FN_LINES}+ lines: remove it from KNOWN_LONG_FNS"
            );
        }
    }
    if c.duplicate_type_names <= MAX_DUPLICATE_TYPE_NAMES {
        for d in &new_dup_names {
            println!("hint: {d} is not in KNOWN_DUPLICATE_TYPE_NAMES: add it");
        }
    }
    for k in KNOWN_DUPLICATE_TYPE_NAMES {
        if duplicates(s).iter().all(|(n, _)| n.as_str() != *k) {
            println!(
                "hint: {k} is no longer defined twice: remove it from KNOWN_DUPLICATE_TYPE_NAMES"
            );
        }
    }
    failures
}

#[test]
fn shape_stays_within_its_ceilings() {
    // syn parses and visits recursively, a frame per nesting level, and a test build's frames
    // are large: the measurement gets a thread with room rather than the test's 2 MiB.
    let shape = std::thread::Builder::new()
        .name("shape".into())
        .stack_size(64 << 20)
        .spawn(measure)
        .expect("spawn the measuring thread")
        .join()
        .expect("the measurement panicked");
    assert!(
        shape.errors.is_empty(),
        "the crate could not be measured:\n{}",
        shape.errors.join("\n")
    );
    println!("{}", table(&shape));
    let failures = check(&shape);
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
