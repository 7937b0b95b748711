//! Negotiation as Prometheus' `expfmt` does it, and the OpenMetrics -> 0.0.4 rewrite line by
//! line: every OpenMetrics type, the suffixes, escaping, exemplars, timestamps, and the errors.

use super::*;

const OM1: Format = Format::OpenMetrics(OPENMETRICS_1);
const OM001: Format = Format::OpenMetrics(OPENMETRICS_0_0_1);

#[test]
fn negotiation_follows_expfmt() {
    for (accept, want) in [
        // No header, curl, a browser: text.
        (vec![], Format::Text),
        (vec!["*/*"], Format::Text),
        (
            vec!["text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"],
            Format::Text,
        ),
        (vec!["text/plain;version=0.0.4"], Format::Text),
        (vec!["text/plain"], Format::Text),
        // Prometheus 2.x's scrape header: OpenMetrics first.
        (
            vec!["application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"],
            OM1,
        ),
        // Prometheus 3.x: with escaping parameters, and a text version it does not get here.
        (
            vec!["application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"],
            OM1,
        ),
        // Native histograms: protobuf first, which is not served: the next clause wins.
        (
            vec!["application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,application/openmetrics-text;version=1.0.0;q=0.5"],
            OM1,
        ),
        (vec!["application/openmetrics-text"], OM001),
        (vec!["application/openmetrics-text; version=0.0.1"], OM001),
        // An OpenMetrics version we do not speak, a text version we do not speak.
        (vec!["application/openmetrics-text;version=2.0.0"], Format::Text),
        (
            vec!["text/plain;version=1.0.0,application/openmetrics-text;q=0.1"],
            OM001,
        ),
        // Quality orders; ties keep the client's order.
        (
            vec!["text/plain;version=0.0.4;q=0.5,application/openmetrics-text;version=1.0.0;q=0.9"],
            OM1,
        ),
        (
            vec!["text/plain;q=0.5,application/openmetrics-text;version=1.0.0;q=0.5"],
            Format::Text,
        ),
        (
            vec!["application/openmetrics-text;version=1.0.0;q=0.5,text/plain;q=0.5"],
            OM1,
        ),
        // q=0 is "not acceptable"; a malformed q reads as 0.
        (vec!["application/openmetrics-text;version=1.0.0;q=0"], Format::Text),
        (vec!["application/openmetrics-text;q=x"], Format::Text),
        // Spaces and case, and several Accept headers read as one list.
        (
            vec![" Application/OpenMetrics-Text ; version=1.0.0 ; q=1 "],
            OM1,
        ),
        (
            vec!["text/plain;q=0.2", "application/openmetrics-text;version=1.0.0"],
            OM1,
        ),
        // Garbage never fails a scrape.
        (vec![";;,,=;q=;version"], Format::Text),
    ] {
        assert_eq!(negotiate(accept.iter().copied()), want, "{accept:?}");
    }
    assert_eq!(
        Format::Text.content_type(),
        "text/plain; version=0.0.4; charset=utf-8"
    );
    assert_eq!(
        OM1.content_type(),
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
}

fn text(om: &str) -> String {
    to_text(om).unwrap_or_else(|e| panic!("{e}:\n{om}"))
}

#[test]
fn counters_gauges_and_eof() {
    let om = "# HELP ng_ticks Ticks run.\n# TYPE ng_ticks counter\nng_ticks_total 3\n\
              ng_ticks_created 1.7e9\n\
              # HELP ng_rss_bytes Resident memory.\n# TYPE ng_rss_bytes gauge\n# UNIT ng_rss_bytes bytes\n\
              ng_rss_bytes{node=\"n\"} 14594048\n# EOF\n";
    assert_eq!(
        text(om),
        "# HELP ng_ticks_total Ticks run.\n# TYPE ng_ticks_total counter\nng_ticks_total 3\n\
         # HELP ng_rss_bytes Resident memory.\n# TYPE ng_rss_bytes gauge\n\
         ng_rss_bytes{node=\"n\"} 14594048\n"
    );
}

#[test]
fn a_family_without_samples_keeps_its_header() {
    let om = "# HELP a_limit_bytes None when unlimited.\n# TYPE a_limit_bytes gauge\n\
              # HELP b Resets.\n# TYPE b counter\n";
    assert_eq!(
        text(om),
        "# HELP a_limit_bytes None when unlimited.\n# TYPE a_limit_bytes gauge\n\
         # HELP b_total Resets.\n# TYPE b_total counter\n"
    );
}

#[test]
fn info_stateset_unknown_and_untyped() {
    let om = "# HELP b Build.\n# TYPE b info\nb_info{version=\"0.1.0\"} 1\n\
              # HELP s State.\n# TYPE s stateset\ns{s=\"a\"} 1\ns{s=\"b\"} 0\n\
              # HELP u Who knows.\n# TYPE u unknown\nu 7\n\
              # HELP v No type line.\nv 8\n";
    assert_eq!(
        text(om),
        "# HELP b_info Build.\n# TYPE b_info gauge\nb_info{version=\"0.1.0\"} 1\n\
         # HELP s State.\n# TYPE s gauge\ns{s=\"a\"} 1\ns{s=\"b\"} 0\n\
         # HELP u Who knows.\n# TYPE u untyped\nu 7\n\
         # HELP v No type line.\n# TYPE v untyped\nv 8\n"
    );
}

#[test]
fn histograms_and_summaries_lose_only_created() {
    let om = "# HELP h Latency.\n# TYPE h histogram\n# UNIT h seconds\n\
              h_bucket{le=\"0.5\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_count 2\nh_sum 0.7\nh_created 1.5\n\
              # HELP q Quantiles.\n# TYPE q summary\nq{quantile=\"0.5\"} 0.1\nq_count 4\nq_sum 0.4\nq_created 2\n";
    assert_eq!(
        text(om),
        "# HELP h Latency.\n# TYPE h histogram\n\
         h_bucket{le=\"0.5\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_count 2\nh_sum 0.7\n\
         # HELP q Quantiles.\n# TYPE q summary\nq{quantile=\"0.5\"} 0.1\nq_count 4\nq_sum 0.4\n"
    );
}

#[test]
fn a_gauge_histogram_becomes_three_gauge_families_of_the_same_series() {
    let om = "# HELP g Queue.\n# TYPE g gaugehistogram\n\
              g_bucket{x=\"1\",le=\"1\"} 3\ng_bucket{x=\"1\",le=\"+Inf\"} 5\ng_gcount{x=\"1\"} 5\ng_gsum{x=\"1\"} 9\n\
              g_bucket{x=\"2\",le=\"+Inf\"} 0\ng_gcount{x=\"2\"} 0\ng_gsum{x=\"2\"} 0\n\
              # TYPE z gauge\nz 1\n";
    assert_eq!(
        text(om),
        "# HELP g_bucket Queue.\n# TYPE g_bucket gauge\n\
         g_bucket{x=\"1\",le=\"1\"} 3\ng_bucket{x=\"1\",le=\"+Inf\"} 5\ng_bucket{x=\"2\",le=\"+Inf\"} 0\n\
         # HELP g_gcount Queue.\n# TYPE g_gcount gauge\ng_gcount{x=\"1\"} 5\ng_gcount{x=\"2\"} 0\n\
         # HELP g_gsum Queue.\n# TYPE g_gsum gauge\ng_gsum{x=\"1\"} 9\ng_gsum{x=\"2\"} 0\n\
         # TYPE z gauge\nz 1\n"
    );
}

#[test]
fn exemplars_go_and_timestamps_become_milliseconds() {
    let om = "# TYPE c counter\n\
              c_total{a=\"1\"} 5 # {trace_id=\"x # y\"} 1.0 1700000000.123\n\
              c_total{a=\"2\"} 6 1700000000.5\n\
              c_total{a=\"3\"} 7 1700000000.25 # {t=\"z\"} 2\n\
              c_total{a=\"4\"} NaN\nc_total{a=\"5\"} +Inf\nc_total{a=\"6\"} 1.5e-3\n";
    assert_eq!(
        text(om),
        "# TYPE c_total counter\n\
         c_total{a=\"1\"} 5\nc_total{a=\"2\"} 6 1700000000500\nc_total{a=\"3\"} 7 1700000000250\n\
         c_total{a=\"4\"} NaN\nc_total{a=\"5\"} +Inf\nc_total{a=\"6\"} 1.5e-3\n"
    );
}

#[test]
fn label_values_pass_verbatim_whatever_they_hold() {
    // Escaped quotes, backslashes, newlines; a brace, " # " and "} 1" inside a value.
    let hostile = r#"m{pod="a\"} 1 # {x=\"y\"} 2",ns="b\\",c="line\nbreak } # x",d="ünï😀"} 1"#;
    let om = format!("# HELP m Hostile.\n# TYPE m gauge\n{hostile}\n# EOF\n");
    assert_eq!(
        text(&om),
        format!("# HELP m Hostile.\n# TYPE m gauge\n{hostile}\n")
    );
}

#[test]
fn help_is_reescaped_for_0_0_4() {
    let om = "# HELP h a \\\"quoted\\\" \\\\ back\\nslash \\x and C:\\\n# TYPE h gauge\nh 1\n";
    assert_eq!(
        text(om),
        "# HELP h a \"quoted\" \\\\ back\\nslash \\\\x and C:\\\\\n# TYPE h gauge\nh 1\n"
    );
}

#[test]
fn what_is_not_openmetrics_is_named() {
    for (om, line, what) in [
        ("# TYPE a gauge\na 1\n# EOF\nb 2\n", 4, "text after # EOF"),
        ("a 1\n", 1, "sample before any descriptor"),
        ("# TYPE a gauge\nb 1\n", 2, "sample outside its family"),
        ("# TYPE a counter\na 1\n", 2, "sample outside its family"),
        (
            "# TYPE a gauge\na_total 1\n",
            2,
            "sample outside its family",
        ),
        (
            "# TYPE a gauge\n# TYPE a counter\n",
            2,
            "family typed twice",
        ),
        (
            "# TYPE a gauge\na 1\n# HELP a late\n",
            3,
            "descriptor after the family's samples",
        ),
        ("# TYPE a weird\n", 1, "unknown type"),
        ("# COMMENT a x\n", 1, "unknown descriptor"),
        (
            "# TYPE a gauge\n\na 1\n",
            2,
            "neither a descriptor nor a sample",
        ),
        (
            "# TYPE a gauge\n#a 1\n",
            2,
            "neither a descriptor nor a sample",
        ),
        ("# TYPE a gauge\na{x=\"1\" 1\n", 2, "unclosed labels"),
        (
            "# TYPE a gauge\na{x=\"1\"}1\n",
            2,
            "no space before the value",
        ),
        ("# TYPE a gauge\na\n", 2, "sample without a value"),
        ("# TYPE a gauge\na 1 2 3\n", 2, "trailing fields"),
        ("# TYPE a gauge\na 1 soon\n", 2, "bad timestamp"),
        ("# TYPE a gauge\na 1 1e300\n", 2, "bad timestamp"),
        ("# TYPE a gauge\na \n", 2, "no value"),
        ("# HELP\n", 1, "bad descriptor"),
    ] {
        assert_eq!(to_text(om), Err(ConvertError { line, what }), "{om:?}");
    }
    assert_eq!(to_text(""), Ok(String::new()));
    assert_eq!(to_text("# EOF\n"), Ok(String::new()));
}
