//! Time to full: when a growing value reaches its limit, projected from the agent's own samples
//! over a short trailing window.
//!
//! Model: `v(t) = c + b * (e^(r t) - 1) / r` with `t <= 0` the age of a sample (seconds before
//! now), `c` the level now, `b` the slope now and `r` how fast the slope itself grows (`r = 0` is
//! a straight line, `r > 0` a loop that keeps doubling on top of a baseline, `r < 0` growth that
//! is levelling off). For each `r` of a fixed grid the fit is ordinary least squares in `(c, b)`;
//! the straight line is kept unless a curved model explains the window much better (an F test),
//! and a projection is made only when the slope is clearly positive (a t test), so noise without
//! growth gives none. `c + b (e^(r τ) - 1) / r = limit` gives `τ = ln(1 + r (limit - c) / b) / r`
//! (`(limit - c) / b` for the line); levelling off below the limit, or beyond [`HORIZON`], is
//! no projection. See docs/design.md ("Time to full").

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The trailing window fitted: long enough to tell a trend from noise at a 5 s interval (60
/// samples), short enough that a plateau after a fix clears the projection within it.
pub const WINDOW: Duration = Duration::from_secs(300);

/// Fewest samples fitted.
pub const MIN_SAMPLES: usize = 6;

/// Projections further out than this are not made: a 5-minute trend says nothing of next week.
pub const HORIZON: f64 = 24.0 * 3600.0;

/// The slope must be this many standard errors above 0.
const T_MIN: f64 = 4.0;
/// A curved model must cut the residual variance this much (F statistic) to replace the line.
const F_MIN: f64 = 12.0;
/// A linear pre-check below this t statistic ends the work early (most series are flat).
const T_GATE: f64 = 2.0;

/// The window for a sampling interval: [`WINDOW`], or 12 samples if the interval is longer.
pub fn window_for(interval: Duration) -> Duration {
    WINDOW.max(interval * 12)
}

/// Doubling (or halving) times of the slope tried, in seconds: 1 s to 4x the window, x1.5 apart.
fn rates(span: f64) -> Vec<f64> {
    let mut out = vec![0.0];
    let mut t = 1.0f64;
    while t <= 4.0 * span.max(1.0) {
        let r = std::f64::consts::LN_2 / t;
        // e^(|r| span) must stay finite.
        if r * span < 600.0 {
            out.push(r);
            out.push(-r);
        }
        t *= 1.5;
    }
    out
}

/// A projection: seconds until the limit, and the model it came from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Projection {
    pub seconds: f64,
    /// Growth rate of the slope, 1/s (0: linear).
    pub rate: f64,
    /// Slope now, units per second.
    pub slope: f64,
}

/// One least-squares fit of `v = c + b f(t)`.
struct Fit {
    c: f64,
    b: f64,
    sse: f64,
    sxx: f64,
}

fn basis(r: f64, t: f64) -> f64 {
    if r == 0.0 {
        t
    } else {
        (r * t).exp_m1() / r
    }
}

fn fit(samples: &[(f64, f64)], r: f64) -> Option<Fit> {
    let n = samples.len() as f64;
    let (mut mx, mut my) = (0.0, 0.0);
    for &(t, v) in samples {
        mx += basis(r, t);
        my += v;
    }
    mx /= n;
    my /= n;
    let (mut sxx, mut sxy, mut syy) = (0.0, 0.0, 0.0);
    for &(t, v) in samples {
        let dx = basis(r, t) - mx;
        let dy = v - my;
        sxx += dx * dx;
        sxy += dx * dy;
        syy += dy * dy;
    }
    if !(sxx.is_finite() && sxy.is_finite()) || sxx <= 0.0 {
        return None;
    }
    let b = sxy / sxx;
    let c = my - b * mx;
    let sse = (syy - b * sxy).max(0.0);
    (b.is_finite() && c.is_finite()).then_some(Fit { c, b, sse, sxx })
}

/// The curved `model` explains `samples` much better than a line (F test, one more parameter).
fn curved(samples: &[(f64, f64)], model: &Fit) -> bool {
    let Some(line) = fit(samples, 0.0) else {
        return false;
    };
    let dof = samples.len() as f64 - 3.0;
    if model.sse == 0.0 {
        return line.sse > 0.0;
    }
    (line.sse - model.sse) / (model.sse / dof) >= F_MIN
}

/// Pure: the projection for `samples` (`(t, value)`, `t` in seconds relative to now, `<= 0`,
/// oldest first) towards `limit`; `None` while the value is not clearly growing towards it.
pub fn project(samples: &[(f64, f64)], limit: f64) -> Option<Projection> {
    let n = samples.len();
    if n < MIN_SAMPLES || !limit.is_finite() {
        return None;
    }
    let span = -samples.first()?.0;
    let line = fit(samples, 0.0)?;
    let t_of = |f: &Fit, n: usize, params: f64| {
        let dof = n as f64 - params;
        let se = (f.sse / dof / f.sxx).sqrt();
        if se == 0.0 {
            f64::INFINITY
        } else {
            f.b / se
        }
    };
    if line.b <= 0.0 || t_of(&line, n, 2.0) < T_GATE {
        return None;
    }
    let mut best = (0.0, line);
    for r in rates(span).into_iter().skip(1) {
        if let Some(f) = fit(samples, r) {
            if f.sse < best.1.sse {
                best = (r, f);
            }
        }
    }
    let (mut r, mut model) = best;
    let mut fitted = n;
    if r != 0.0 && !curved(samples, &model) {
        r = 0.0;
        model = fit(samples, 0.0)?;
    } else if r > 0.0 {
        // A kink (flat, then a steady climb) also looks like a take-off over the whole window:
        // acceleration counts only if the recent quarter shows it too, else the recent line is
        // the trend now.
        let recent = &samples[n - (n / 4).max(MIN_SAMPLES)..];
        let mut best_recent: Option<Fit> = None;
        for r in rates(-recent[0].0).into_iter().filter(|r| *r > 0.0) {
            if let Some(f) = fit(recent, r) {
                if best_recent.as_ref().is_none_or(|b| f.sse < b.sse) {
                    best_recent = Some(f);
                }
            }
        }
        if !best_recent.is_some_and(|f| curved(recent, &f)) {
            r = 0.0;
            model = fit(recent, 0.0)?;
            fitted = recent.len();
        }
    }
    let params = if r == 0.0 { 2.0 } else { 3.0 };
    if model.b <= 0.0 || t_of(&model, fitted, params) < T_MIN {
        return None;
    }
    let remaining = limit - model.c;
    let seconds = if remaining <= 0.0 {
        0.0
    } else if r == 0.0 {
        remaining / model.b
    } else {
        let x = 1.0 + r * remaining / model.b;
        // Levelling off below the limit: it is never reached.
        if x <= 0.0 {
            return None;
        }
        x.ln() / r
    };
    (seconds.is_finite() && seconds <= HORIZON).then_some(Projection {
        seconds,
        rate: r,
        slope: model.b,
    })
}

/// The trailing samples of one value and their projection.
#[derive(Debug, Clone)]
pub struct FullEstimator {
    window: Duration,
    samples: VecDeque<(Instant, f64)>,
    scratch: Vec<(f64, f64)>,
}

impl Default for FullEstimator {
    fn default() -> Self {
        FullEstimator::new(WINDOW)
    }
}

impl FullEstimator {
    pub fn new(window: Duration) -> Self {
        FullEstimator {
            window,
            samples: VecDeque::new(),
            scratch: Vec::new(),
        }
    }

    /// A new window (the interval was reloaded): the samples kept stay, the next `observe`
    /// trims them to it.
    pub fn set_window(&mut self, window: Duration) {
        self.window = window;
    }

    /// Forgets the history (a new container instance, a value that went away).
    pub fn reset(&mut self) {
        self.samples.clear();
    }

    /// Records `value` at `now` and projects when it reaches `limit`. Samples closer than
    /// 1/120 of the window to the previous one are not kept (at most ~121 samples).
    pub fn observe(&mut self, now: Instant, value: f64, limit: f64) -> Option<Projection> {
        let min_gap = self.window / 120;
        let keep = self
            .samples
            .back()
            .is_none_or(|(t, _)| now.saturating_duration_since(*t) >= min_gap);
        if keep && value.is_finite() {
            self.samples.push_back((now, value));
        }
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > self.window)
        {
            self.samples.pop_front();
        }
        self.scratch.clear();
        self.scratch.extend(
            self.samples
                .iter()
                .map(|(t, v)| (-now.saturating_duration_since(*t).as_secs_f64(), *v)),
        );
        project(&self.scratch, limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_secs(5);

    /// Feeds `f(seconds since start)` every 5 s for `ticks` ticks; returns every projection.
    fn run(
        est: &mut FullEstimator,
        t0: Instant,
        from: u32,
        ticks: u32,
        limit: f64,
        f: impl Fn(f64) -> f64,
    ) -> Vec<Option<Projection>> {
        (from..from + ticks)
            .map(|i| {
                let s = f64::from(i) * 5.0;
                est.observe(t0 + TICK * i, f(s), limit)
            })
            .collect()
    }

    #[test]
    fn linear_growth_projects_the_line() {
        let t0 = Instant::now();
        let mut est = FullEstimator::default();
        // 1,000 + 10/s towards 10,000: full at t = 900 s.
        let got = run(&mut est, t0, 0, 61, 10_000.0, |s| 1000.0 + 10.0 * s);
        // Nothing before 6 samples.
        assert!(got[..5].iter().all(Option::is_none));
        let p = got[5].expect("projection at the 6th sample");
        // At t = 25 s: 875 s left, exactly, from the line.
        assert_eq!(p.rate, 0.0);
        assert!((p.seconds - 875.0).abs() < 1e-6, "{p:?}");
        let last = got[60].expect("projection at t = 300 s");
        assert!((last.seconds - 600.0).abs() < 1e-6, "{last:?}");
        assert!((last.slope - 10.0).abs() < 1e-9);
    }

    #[test]
    fn doubling_every_five_seconds_is_projected_as_a_doubling() {
        let t0 = Instant::now();
        let mut est = FullEstimator::default();
        // 4,000 entries of normal traffic, then a storm that doubles every 5 s from 1 entry:
        // 4,000 + 2^(s/5) reaches 131,072 when 2^(s/5) = 127,072, at s = 84.8 s.
        let limit = 131_072.0;
        let storm = |s: f64| 4000.0 + (s / 5.0).exp2();
        let got = run(&mut est, t0, 0, 17, limit, storm);
        let (i, p) = got
            .iter()
            .enumerate()
            .find_map(|(i, p)| p.map(|p| (i, p)))
            .expect("a projection before the table is full");
        let now = i as f64 * 5.0;
        let truth = 5.0 * (limit - 4000.0).log2() - now;
        // Projected from the 6th sample (t = 25 s): 60.5 s, the truth being 59.8 s.
        assert_eq!(i, 5, "{got:?}");
        assert!(p.rate > 0.0, "{p:?}");
        assert!((p.seconds - truth).abs() <= 0.1 * truth, "{p:?} vs {truth}");
        // Every later tick projects within 10 % of the truth (a line would say hours).
        for (j, p) in got.iter().enumerate().skip(i) {
            let truth = 5.0 * (limit - 4000.0).log2() - j as f64 * 5.0;
            let p = p.expect("projection kept");
            assert!(
                (p.seconds - truth).abs() <= 0.1 * truth.max(5.0),
                "tick {j}: {p:?} vs {truth}"
            );
        }
    }

    /// xorshift, fixed seed: the same "noise" every run.
    fn noise(seed: &mut u64) -> f64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        (*seed % 2001) as f64 / 1000.0 - 1.0
    }

    #[test]
    fn noise_without_growth_projects_nothing() {
        let t0 = Instant::now();
        let mut est = FullEstimator::default();
        let mut seed = 0x2545_f491_4f6c_dd1d;
        // +-5 % around 50,000 of a 60,000 limit, for an hour of ticks.
        for i in 0..720u32 {
            let v = 50_000.0 + 2_500.0 * noise(&mut seed);
            assert_eq!(est.observe(t0 + TICK * i, v, 60_000.0), None, "tick {i}");
        }
    }

    #[test]
    fn plateau_after_mitigation_clears_the_projection() {
        let t0 = Instant::now();
        let mut est = FullEstimator::default();
        let mut seed = 7;
        // Linear growth with noise for 10 min, then flat at the level reached (with noise).
        let grow = |s: f64| 10_000.0 + 50.0 * s;
        let mut last = None;
        for i in 0..120u32 {
            let s = f64::from(i) * 5.0;
            last = est.observe(t0 + TICK * i, grow(s) + 100.0 * noise(&mut seed), 131_072.0);
        }
        // At t = 595 s the truth is (131,072 - 39,750) / 50 = 1,826 s.
        assert!(
            last.is_some_and(|p| (p.seconds - 1_826.0).abs() < 30.0),
            "{last:?}"
        );
        let top = grow(595.0);
        let mut cleared_at = None;
        for i in 120..240u32 {
            let p = est.observe(t0 + TICK * i, top + 100.0 * noise(&mut seed), 131_072.0);
            if p.is_none() && cleared_at.is_none() {
                cleared_at = Some(i - 120);
            }
            if cleared_at.is_some() && i - 120 >= 60 {
                assert_eq!(p, None, "projection came back at tick {i}");
            }
        }
        // Gone 4 ticks (20 s) after the plateau began, and for good once the ramp left the window.
        assert_eq!(cleared_at, Some(4));
    }

    #[test]
    fn at_or_above_the_limit_is_zero_and_falling_is_nothing() {
        let t0 = Instant::now();
        let mut est = FullEstimator::default();
        let got = run(&mut est, t0, 0, 10, 100.0, |s| 50.0 + s);
        assert_eq!(got[9].map(|p| p.seconds), Some(5.0));
        let got = run(&mut est, t0, 10, 5, 100.0, |s| 50.0 + s);
        assert_eq!(got[4].map(|p| p.seconds), Some(0.0));
        let mut est = FullEstimator::default();
        let got = run(&mut est, t0, 0, 30, 100.0, |s| 90.0 - s);
        assert!(got.iter().all(Option::is_none));
        // Too slow to matter: beyond the horizon.
        let mut est = FullEstimator::default();
        let got = run(&mut est, t0, 0, 30, 1e9, |s| 1.0 + s);
        assert!(got.iter().all(Option::is_none));
    }

    #[test]
    fn the_window_bounds_the_samples() {
        let t0 = Instant::now();
        let mut est = FullEstimator::default();
        for i in 0..10_000u32 {
            est.observe(t0 + Duration::from_millis(100) * i, 1.0, 2.0);
        }
        assert!(est.samples.len() <= 121, "{}", est.samples.len());
        assert_eq!(window_for(Duration::from_secs(5)), WINDOW);
        assert_eq!(
            window_for(Duration::from_secs(60)),
            Duration::from_secs(720)
        );
    }
}

/// The 20 July replay of `daemonset/rules/tests/incident-2026-07-20.test.yaml`: the replay's
/// per-minute series, sampled every 5 s as the agent would (linear between minutes), through
/// the estimator. Its figures are the `*_full_in_seconds` series of that file.
#[cfg(test)]
mod replay {
    use super::*;

    /// Piecewise-linear per-minute series: `(first minute, value then, slope per minute)`.
    fn at(phases: &[(u32, f64, f64)], minute: f64) -> f64 {
        let (m0, v0, slope) = phases
            .iter()
            .rev()
            .find(|(m, _, _)| f64::from(*m) <= minute)
            .copied()
            .unwrap_or(phases[0]);
        v0 + slope * (minute - f64::from(m0)).floor().max(0.0)
            + slope * (minute - minute.floor()) * f64::from(minute.floor() as u32 >= m0)
    }

    /// Projection at each whole minute in `minutes`, resetting at `resets` (a new instance).
    fn replay(
        phases: &[(u32, f64, f64)],
        limit: f64,
        minutes: std::ops::Range<u32>,
        resets: &[u32],
    ) -> Vec<(u32, Option<f64>)> {
        let t0 = Instant::now();
        let mut est = FullEstimator::default();
        let mut out = Vec::new();
        for tick in 0..minutes.end * 12 {
            let minute = f64::from(tick) / 12.0;
            if tick % 12 == 0 && resets.contains(&(tick / 12)) {
                est.reset();
            }
            let p = est.observe(
                t0 + Duration::from_secs(5) * tick,
                at(phases, minute),
                limit,
            );
            if tick % 12 == 0 && minutes.contains(&(tick / 12)) {
                out.push((tick / 12, p.map(|p| p.seconds.round())));
            }
        }
        out
    }

    /// promtool's expanding notation (`a+bxN` is N+1 values, `_xN` N blanks).
    fn promtool(values: &[Option<f64>]) -> String {
        let mut out = Vec::new();
        let mut i = 0;
        while i < values.len() {
            let mut j = i;
            match values[i] {
                None => {
                    while j + 1 < values.len() && values[j + 1].is_none() {
                        j += 1;
                    }
                    out.push(if j == i {
                        "_".to_owned()
                    } else {
                        format!("_x{}", j - i + 1)
                    });
                }
                Some(a) => {
                    let step = values.get(i + 1).copied().flatten().map(|b| b - a);
                    while let (Some(d), Some(Some(next))) = (step, values.get(j + 1)) {
                        if next - values[j].unwrap_or(f64::NAN) != d {
                            break;
                        }
                        j += 1;
                    }
                    let d = step.filter(|_| j > i).unwrap_or(0.0);
                    out.push(match (j - i, d) {
                        (0, _) => format!("{a}"),
                        (k, 0.0) => format!("{a}x{k}"),
                        (k, d) if d > 0.0 => format!("{a}+{d}x{k}"),
                        (k, d) => format!("{a}-{}x{k}", -d),
                    });
                }
            }
            i = j + 1;
        }
        out.join(" ")
    }

    const REPLAY: &str = include_str!("../../daemonset/rules/tests/incident-2026-07-20.test.yaml");

    #[test]
    fn memory_of_the_backend() {
        let phases = [
            (0, 5_153_960_755.0, 0.0),
            (5, 5_153_960_755.0, 9_311_582.0),
            (375, 3_221_225_472.0, 8_131_000.0),
            (1023, 3_221_225_472.0, 8_131_000.0),
        ];
        let got = replay(&phases, 8_589_934_592.0, 0..1290, &[375, 1023]);
        let first_below = got.iter().find(|(_, p)| p.is_some_and(|s| s < 14_400.0));
        // Below 4 h from 02:15 (the level alert's 85 % is crossed at 03:56).
        assert_eq!(first_below, Some(&(135, Some(14_340.0))));
        let series = promtool(&got.iter().map(|(_, p)| *p).collect::<Vec<_>>());
        assert!(
            REPLAY.contains(&format!("values: '{series} stale'")),
            "{series}"
        );
    }

    #[test]
    fn conntrack_of_the_node() {
        let phases = [
            (0, 4000.0, 0.0),
            (5, 4464.0, 96.0),
            (375, 4464.0, 100.0),
            (1023, 4669.0, 362.0),
            (1290, 4464.0, 0.0),
        ];
        let got = replay(&phases, 131_072.0, 0..1440, &[]);
        let first_below = got.iter().find(|(_, p)| p.is_some_and(|s| s < 14_400.0));
        // Below 4 h from 18:53, at 47 % of the table.
        assert_eq!(first_below, Some(&(1133, Some(14_351.0))));
        let series = promtool(&got.iter().map(|(_, p)| *p).collect::<Vec<_>>());
        assert!(REPLAY.contains(&format!("values: '{series}'")), "{series}");
    }
}
