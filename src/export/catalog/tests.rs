use super::*;
use std::collections::BTreeSet;

#[test]
fn names_are_unique_and_end_in_their_unit() {
    let all = all();
    let names: BTreeSet<String> = all.iter().map(Meta::exposed_name).collect();
    assert_eq!(names.len(), all.len(), "a family declared twice");
    for m in &all {
        assert!(
            !m.name.ends_with("_total"),
            "{}: registered without _total",
            m.name
        );
        let suffix = m.name.rsplit('_').next().unwrap_or("");
        match m.unit {
            Some(u) => assert_eq!(suffix, u.as_str(), "{}: the name ends in its unit", m.name),
            None => assert!(
                !["bytes", "seconds"].contains(&suffix),
                "{}: a base-unit name declares its unit",
                m.name
            ),
        }
        assert!(
            !m.help.is_empty() && m.help.ends_with('.'),
            "{}: help",
            m.name
        );
    }
}

#[test]
fn labels_are_unique_and_enumerations_not_empty() {
    for m in all() {
        let mut seen = BTreeSet::new();
        for l in m.labels {
            assert!(l.name != "node", "{}: node is added by the encoder", m.name);
            assert!(seen.insert(l.name), "{}: label {} twice", m.name, l.name);
            if let Some(values) = l.values {
                let v = values();
                let distinct: BTreeSet<_> = v.iter().collect();
                assert!(
                    !v.is_empty() && distinct.len() == v.len(),
                    "{}: {}",
                    m.name,
                    l.name
                );
            }
        }
    }
}

#[test]
fn enumerations_come_from_the_enums() {
    let values = |family: &str, label: &str| -> Vec<&'static str> {
        let m = all().into_iter().find(|m| m.name == family).expect(family);
        let l = m.labels.iter().find(|l| l.name == label).expect(label);
        (l.values.expect("enumerated"))()
    };
    assert_eq!(
        values("sampler_errors", "kind"),
        ["io", "permission", "parse"]
    );
    assert_eq!(
        values("container_log_lines", "stream"),
        ["stdout", "stderr"]
    );
    assert_eq!(values("workloads", "kind"), ["container", "unit"]);
    assert_eq!(
        values("actions", "outcome"),
        ["done", "dry_run", "replaced", "gone", "failed"]
    );
    assert_eq!(
        values("http_connections_timed_out", "reason"),
        ["header", "idle", "write"]
    );
    use crate::cgroupfs::CgroupLayout;
    use std::path::PathBuf;
    let p = PathBuf::new;
    let layouts = [
        CgroupLayout::Unified { root: p() },
        CgroupLayout::Legacy { root: p() },
        CgroupLayout::Hybrid {
            root: p(),
            unified: p(),
        },
    ];
    let names: Vec<_> = layouts.iter().map(CgroupLayout::name).collect();
    let mut declared = values("build_info", "cgroup_layout");
    declared.sort_unstable();
    let mut names = names;
    names.sort_unstable();
    assert_eq!(names, declared);
}

#[test]
fn rows_keep_one_value_per_label() {
    let mut r = Rows::new(2);
    r.add(&["a", "b"], 1u64);
    r.add(&["c", "d"], 2.5);
    let rows: Vec<_> = r.iter().map(|(l, v)| (l.to_vec(), v)).collect();
    assert_eq!(
        rows,
        [(vec!["a", "b"], Num::U(1)), (vec!["c", "d"], Num::F(2.5))]
    );
    let mut bare = Rows::new(0);
    bare.add(&[], true);
    assert_eq!(bare.iter().collect::<Vec<_>>(), [(&[][..], Num::U(1))]);
}
