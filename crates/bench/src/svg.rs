//! A small, dependency-free SVG plotter for the experiments' curves: several named
//! series of points, linear or logarithmic axes with ticks and labels, and a legend.
//!
//! Message sizes are best read on a log2 axis (1 B … 16 MiB) and times on a log10 axis
//! (µs … ms), so both scales are built in.

use std::fmt::Write as _;

use crate::{format_ns, format_size};

/// How an axis maps values to positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Evenly spaced values.
    Linear,
    /// Powers of two evenly spaced; non-positive values are not drawn.
    Log2,
    /// Powers of ten evenly spaced; non-positive values are not drawn.
    Log10,
}

/// How tick values are labelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TickFormat {
    /// Plain numbers.
    Plain,
    /// Byte counts (`4 KiB`).
    Bytes,
    /// Nanoseconds shown as durations (`10 µs`).
    Nanoseconds,
}

/// One axis.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    /// The axis title.
    pub label: String,
    /// Its scale.
    pub scale: Scale,
    /// How its ticks are labelled.
    pub ticks: TickFormat,
}

/// One named curve.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Name shown in the legend.
    pub name: String,
    /// `(x, y)` points; drawn in order of x.
    pub points: Vec<(f64, f64)>,
}

/// A line plot with markers.
#[derive(Debug, Clone, PartialEq)]
pub struct Plot {
    /// Title above the plot.
    pub title: String,
    /// Horizontal axis.
    pub x: Axis,
    /// Vertical axis.
    pub y: Axis,
    /// The curves.
    pub series: Vec<Series>,
}

const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 520.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 220.0; // room for the legend
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const PALETTE: &[&str] = &["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

/// The visible range of an axis, in transformed units (log2/log10 of the value for
/// logarithmic axes).
#[derive(Debug, Clone, Copy)]
struct Range {
    lo: f64,
    hi: f64,
}

impl Scale {
    fn transform(self, v: f64) -> Option<f64> {
        let t = match self {
            Scale::Linear => v,
            Scale::Log2 if v > 0.0 => v.log2(),
            Scale::Log10 if v > 0.0 => v.log10(),
            _ => return None,
        };
        t.is_finite().then_some(t)
    }

    fn untransform(self, t: f64) -> f64 {
        match self {
            Scale::Linear => t,
            Scale::Log2 => t.exp2(),
            Scale::Log10 => 10f64.powf(t),
        }
    }

    /// A range covering `values` (already transformed): whole powers on log axes, a
    /// little padding on linear ones, never empty.
    fn range(self, values: impl Iterator<Item = f64>) -> Range {
        let (mut lo, mut hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
        if !lo.is_finite() || !hi.is_finite() {
            return Range { lo: 0.0, hi: 1.0 };
        }
        match self {
            Scale::Linear => {
                let pad = ((hi - lo) * 0.05).max(if hi == lo { 1.0 } else { 0.0 });
                lo -= pad;
                hi += pad;
            }
            Scale::Log2 | Scale::Log10 => {
                lo = lo.floor();
                hi = hi.ceil();
                if hi == lo {
                    hi += 1.0;
                }
            }
        }
        Range { lo, hi }
    }

    /// Tick positions (transformed units): whole powers on log axes, thinned to at most
    /// ten; 1-2-5 steps on linear axes.
    fn ticks(self, range: Range) -> Vec<f64> {
        match self {
            Scale::Log2 | Scale::Log10 => {
                let n = (range.hi - range.lo).round() as usize + 1;
                let step = [1usize, 2, 4, 5, 10, 20].into_iter().find(|s| n.div_ceil(*s) <= 10).unwrap_or(n.max(1));
                (0..n).step_by(step).map(|i| range.lo + i as f64).collect()
            }
            Scale::Linear => {
                let span = range.hi - range.lo;
                let raw = span / 8.0;
                let magnitude = 10f64.powf(raw.log10().floor());
                let step = [1.0, 2.0, 5.0, 10.0]
                    .into_iter()
                    .map(|m| m * magnitude)
                    .find(|s| span / s <= 10.0)
                    .unwrap_or(10.0 * magnitude);
                let first = (range.lo / step).ceil() as i64;
                let last = (range.hi / step).floor() as i64;
                (first..=last).map(|i| i as f64 * step).collect()
            }
        }
    }
}

impl TickFormat {
    fn label(self, value: f64) -> String {
        match self {
            TickFormat::Bytes if value >= 1.0 && value.fract() == 0.0 => format_size(value as usize),
            TickFormat::Nanoseconds => compact(format_ns(value)),
            _ => trim_number(value),
        }
    }
}

/// `1.00 µs` → `1 µs`, `2.50 ms` → `2.5 ms`: tick labels need no trailing zeros.
fn compact(label: String) -> String {
    match label.split_once(' ') {
        Some((number, unit)) if number.contains('.') => {
            format!("{} {unit}", number.trim_end_matches('0').trim_end_matches('.'))
        }
        _ => label,
    }
}

fn trim_number(v: f64) -> String {
    let text = format!("{v:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Escapes text for XML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Control characters are not allowed in XML 1.0.
            c if c.is_control() && c != '\n' && c != '\t' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

impl Plot {
    /// Renders the plot as a standalone SVG document.
    pub fn render(&self) -> String {
        let plot_w = WIDTH - LEFT - RIGHT;
        let plot_h = HEIGHT - TOP - BOTTOM;

        // Transformed points per series, dropping what the scales cannot show.
        let series: Vec<Vec<(f64, f64)>> = self
            .series
            .iter()
            .map(|s| {
                let mut points: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .filter_map(|&(x, y)| Some((self.x.scale.transform(x)?, self.y.scale.transform(y)?)))
                    .collect();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                points
            })
            .collect();
        let xr = self.x.scale.range(series.iter().flatten().map(|p| p.0));
        let yr = self.y.scale.range(series.iter().flatten().map(|p| p.1));
        let px = |t: f64| LEFT + (t - xr.lo) / (xr.hi - xr.lo) * plot_w;
        let py = |t: f64| TOP + plot_h - (t - yr.lo) / (yr.hi - yr.lo) * plot_h;

        let mut svg = String::new();
        // `write!` into a String cannot fail; the results are ignored on purpose.
        let _ = writeln!(
            svg,
            r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">
<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>
<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
            LEFT + plot_w / 2.0,
            escape(&self.title)
        );

        // Grid, ticks and tick labels.
        for t in self.x.scale.ticks(xr) {
            let x = px(t);
            let label = self.x.ticks.label(self.x.scale.untransform(t));
            let _ = writeln!(
                svg,
                r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#e0e0e0"/>
<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                TOP + plot_h,
                TOP + plot_h + 18.0,
                escape(&label)
            );
        }
        for t in self.y.scale.ticks(yr) {
            let y = py(t);
            let label = self.y.ticks.label(self.y.scale.untransform(t));
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e0e0e0"/>
<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT + plot_w,
                LEFT - 6.0,
                y + 4.0,
                escape(&label)
            );
        }

        // Frame and axis titles.
        let _ = writeln!(
            svg,
            r#"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>
<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>
<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">{}</text>"#,
            LEFT + plot_w / 2.0,
            HEIGHT - 16.0,
            escape(&self.x.label),
            TOP + plot_h / 2.0,
            TOP + plot_h / 2.0,
            escape(&self.y.label)
        );

        // Curves and legend.
        for (i, (points, s)) in series.iter().zip(&self.series).enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            if points.len() > 1 {
                let path: Vec<String> = points.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
                let _ = writeln!(
                    svg,
                    r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
                    path.join(" ")
                );
            }
            for &(x, y) in points {
                let _ = writeln!(svg, r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#, px(x), py(y));
            }
            let ly = TOP + 10.0 + i as f64 * 20.0;
            let lx = LEFT + plot_w + 16.0;
            let _ = writeln!(
                svg,
                r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"/>
<text x="{:.1}" y="{:.1}">{}</text>"#,
                lx + 24.0,
                lx + 30.0,
                ly + 4.0,
                escape(&s.name)
            );
        }
        svg.push_str("</svg>\n");
        svg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks that every element is closed in order: enough to catch a broken writer.
    fn balanced(xml: &str) -> Result<(), String> {
        let mut stack: Vec<String> = Vec::new();
        let mut rest = xml;
        while let Some(start) = rest.find('<') {
            let end = rest[start..].find('>').ok_or("unterminated tag")? + start;
            let tag = &rest[start + 1..end];
            rest = &rest[end + 1..];
            if tag.starts_with('?') || tag.starts_with('!') {
                continue;
            }
            if let Some(name) = tag.strip_prefix('/') {
                match stack.pop() {
                    Some(open) if open == name.trim() => {}
                    other => return Err(format!("</{name}> closes {other:?}")),
                }
            } else if !tag.ends_with('/') {
                let name = tag.split_whitespace().next().ok_or("empty tag")?;
                stack.push(name.to_string());
            }
        }
        if stack.is_empty() {
            Ok(())
        } else {
            Err(format!("unclosed {stack:?}"))
        }
    }

    fn sample() -> Plot {
        Plot {
            title: "round trip <p50> & friends".to_string(),
            x: Axis { label: "message size".to_string(), scale: Scale::Log2, ticks: TickFormat::Bytes },
            y: Axis { label: "time".to_string(), scale: Scale::Log10, ticks: TickFormat::Nanoseconds },
            series: vec![
                Series {
                    name: "seqpacket \"uds\"".to_string(),
                    points: vec![(1.0, 9000.0), (16.0 * 1024.0 * 1024.0, 9e6), (64.0, 9100.0)],
                },
                Series {
                    name: "empty".to_string(),
                    points: vec![(0.0, 1.0)], // not drawable on a log axis
                },
            ],
        }
    }

    #[test]
    fn output_is_balanced_and_escaped() {
        let svg = sample().render();
        balanced(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
        assert!(svg.starts_with("<?xml"));
        assert!(svg.contains("round trip &lt;p50&gt; &amp; friends"));
        assert!(svg.contains("seqpacket &quot;uds&quot;"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn log_axes_get_readable_ticks() {
        let svg = sample().render();
        assert!(svg.contains(">1 B<"), "{svg}");
        assert!(svg.contains(">16 MiB<"), "{svg}");
        assert!(svg.contains(">1 µs<") && svg.contains(">10 ms<"), "{svg}");
        // 25 powers of two thinned to at most ten ticks.
        assert!(Scale::Log2.ticks(Range { lo: 0.0, hi: 24.0 }).len() <= 10);
    }

    #[test]
    fn linear_ticks_use_round_steps() {
        let ticks = Scale::Linear.ticks(Range { lo: -0.5, hi: 10.5 });
        assert_eq!(ticks, vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
    }

    #[test]
    fn empty_plot_is_still_well_formed() {
        let mut plot = sample();
        plot.series.clear();
        balanced(&plot.render()).expect("balanced");
    }

    #[test]
    fn escape_handles_all_markup_characters() {
        assert_eq!(escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&apos;");
        assert_eq!(escape("bell\u{7}"), "bell ");
    }
}
