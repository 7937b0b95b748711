//! The metric catalog: every family the agent exports, declared once — name, type, unit, help,
//! labels (with the values an enumerated label may take, from the enums where there is one), the
//! section of docs/metrics.md that documents it, and the rows it takes from its source. The
//! collectors iterate these lists in order (the order is the exposition's); docs/metrics.md and
//! nodeguard-gen's check of the shipped rules are checked against them.
//!
//! One module per group of families, in exposition order, each reading one part of its source:
//! [`workloads`], [`network`], [`kmsg`], [`guard`], [`inputs`], [`agent`] and [`config`] read the
//! snapshot, [`http`] the server's counters, [`watchdog`] the tick watchdog. `node` is on every
//! series when a node name is known and is not declared per family: it follows the identity
//! labels (`namespace`, `pod`, `container`) when a family has them, else comes first.

pub mod agent;
pub mod config;
pub mod guard;
pub mod http;
pub mod inputs;
pub mod kmsg;
pub mod network;
pub mod watchdog;
pub mod workloads;

use crate::export::stats::ServerStats;
use crate::export::watchdog::TickWatch;
use crate::model::Published;

pub const PREFIX: &str = "nodeguard";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    Gauge,
    Counter,
}

impl Type {
    pub fn as_str(self) -> &'static str {
        match self {
            Type::Gauge => "gauge",
            Type::Counter => "counter",
        }
    }
}

/// The base unit a family's name ends with. Not written as an OpenMetrics `# UNIT` line: the
/// exposition predates the catalog and stays byte for byte what it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    Seconds,
}

impl Unit {
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Bytes => "bytes",
            Unit::Seconds => "seconds",
        }
    }
}

/// The `##` section of docs/metrics.md whose table lists a family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Workloads,
    Network,
    Guard,
    Agent,
}

impl Section {
    pub fn heading(self) -> &'static str {
        match self {
            Section::Workloads => "Workloads",
            Section::Network => "Network namespaces and conntrack",
            Section::Guard => "Guard (rules and breakers)",
            Section::Agent => "The agent itself",
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Label {
    pub name: &'static str,
    /// The values an enumerated label takes; `None` for a free one (names, rules, versions).
    pub values: Option<fn() -> Vec<&'static str>>,
}

impl Label {
    pub const fn free(name: &'static str) -> Label {
        Label { name, values: None }
    }
    pub const fn of(name: &'static str, values: fn() -> Vec<&'static str>) -> Label {
        Label {
            name,
            values: Some(values),
        }
    }
}

pub const NAMESPACE: Label = Label::free("namespace");
pub const POD: Label = Label::free("pod");
pub const CONTAINER: Label = Label::free("container");
pub const RULE: Label = Label::free("rule");
/// The labels of a container series, and of a pod series.
pub const CONTAINER_ID: [Label; 3] = [NAMESPACE, POD, CONTAINER];
pub const POD_ID: [Label; 2] = [NAMESPACE, POD];

/// A sample value: the encoder writes integers and floats differently (`1` and `1.0`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    U(u64),
    F(f64),
}

impl From<u64> for Num {
    fn from(v: u64) -> Num {
        Num::U(v)
    }
}

impl From<f64> for Num {
    fn from(v: f64) -> Num {
        Num::F(v)
    }
}

impl From<bool> for Num {
    fn from(v: bool) -> Num {
        Num::U(u64::from(v))
    }
}

impl From<usize> for Num {
    fn from(v: usize) -> Num {
        Num::U(v as u64)
    }
}

/// The samples of one family: per row, one value per declared label (in order), then the value.
#[derive(Debug, Default)]
pub struct Rows<'a> {
    width: usize,
    values: Vec<&'a str>,
    nums: Vec<Num>,
}

impl<'a> Rows<'a> {
    pub(crate) fn new(width: usize) -> Self {
        Rows {
            width,
            values: Vec::new(),
            nums: Vec::new(),
        }
    }

    /// One row; a row with more or fewer values than the family's labels is a bug of its row
    /// function: it fails the tests (every family is rendered there) and is dropped in a release
    /// build rather than misplacing every later row's labels.
    pub fn add(&mut self, labels: &[&'a str], v: impl Into<Num>) {
        if labels.len() != self.width {
            debug_assert!(
                false,
                "{} label values for {} labels",
                labels.len(),
                self.width
            );
            return;
        }
        self.values.extend_from_slice(labels);
        self.nums.push(v.into());
    }

    pub fn len(&self) -> usize {
        self.nums.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nums.is_empty()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[&'a str], Num)> + '_ {
        let w = self.width;
        (0..self.nums.len()).map(move |i| (&self.values[i * w..(i + 1) * w], self.nums[i]))
    }
}

/// One metric family: what it is, and where its samples come from in `S`.
pub struct Family<S> {
    pub meta: Meta,
    pub rows: for<'a> fn(&'a S, &mut Rows<'a>),
}

/// What a family is, whatever its source.
#[derive(Debug, Clone, Copy)]
pub struct Meta {
    /// As registered: without the `nodeguard_` prefix, and a counter without `_total`.
    pub name: &'static str,
    pub ty: Type,
    pub unit: Option<Unit>,
    pub help: &'static str,
    pub labels: &'static [Label],
    pub section: Section,
}

impl<S> Family<S> {
    pub fn meta(&self) -> Meta {
        self.meta
    }
}

impl Meta {
    /// The family of this `Meta` whose samples `rows` takes from `S`.
    pub const fn with_rows<S>(self, rows: for<'a> fn(&'a S, &mut Rows<'a>)) -> Family<S> {
        Family { meta: self, rows }
    }

    /// Where `node` goes among the declared labels: after the identity labels.
    pub(crate) fn node_at(&self) -> usize {
        self.labels
            .iter()
            .take_while(|l| matches!(l.name, "namespace" | "pod" | "container"))
            .count()
    }

    /// The name a query uses: `nodeguard_<name>`, `_total` after a counter's.
    pub fn exposed_name(&self) -> String {
        match self.ty {
            Type::Counter => format!("{PREFIX}_{}_total", self.name),
            Type::Gauge => format!("{PREFIX}_{}", self.name),
        }
    }

    /// The labels cell of the family's row in docs/metrics.md: `ns, pod, kind=`a`\|`b``.
    pub fn docs_labels(&self) -> String {
        let cell: Vec<String> = self
            .labels
            .iter()
            .map(|l| {
                let name = if l.name == "namespace" { "ns" } else { l.name };
                match l.values {
                    None => name.to_owned(),
                    Some(v) => {
                        let vs: Vec<String> = v().iter().map(|x| format!("`{x}`")).collect();
                        format!("{name}={}", vs.join("\\|"))
                    }
                }
            })
            .collect();
        cell.join(", ")
    }
}

/// The snapshot's families, in exposition order (one collector).
pub const SNAPSHOT: [&[Family<Published>]; 6] = [
    workloads::FAMILIES,
    network::FAMILIES,
    kmsg::FAMILIES,
    guard::FAMILIES,
    inputs::FAMILIES,
    agent::FAMILIES,
];

/// The configuration's families (their own collector: republished at once after a reload).
pub const CONFIG: &[Family<Published>] = config::FAMILIES;

/// The HTTP server's families, read from its counters.
pub const HTTP: &[Family<ServerStats>] = http::FAMILIES;

/// The tick watchdog's families, computed at scrape time.
pub const WATCHDOG: &[Family<TickWatch>] = watchdog::FAMILIES;

/// Every family the agent exports, in exposition order.
pub fn all() -> Vec<Meta> {
    SNAPSHOT
        .iter()
        .flat_map(|p| p.iter())
        .chain(CONFIG)
        .map(Family::meta)
        .chain(HTTP.iter().map(Family::meta))
        .chain(WATCHDOG.iter().map(Family::meta))
        .collect()
}

/// The names queries use (`nodeguard_..._total` for counters): what rules may refer to.
pub fn exposed_names() -> Vec<String> {
    all().iter().map(Meta::exposed_name).collect()
}

/// Names of an enum's values, for an enumerated label.
pub(crate) fn names<T>(all: &[T], name: fn(&T) -> &'static str) -> Vec<&'static str> {
    all.iter().map(name).collect()
}

#[cfg(test)]
mod tests;
