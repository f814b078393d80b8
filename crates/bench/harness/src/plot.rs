//! The experiments' plots, one plotting path for all of them: SVG documents written
//! by hand, and a checker that what is written is well-formed.
//!
//! - [`Plot`]: several named series of points, linear or logarithmic axes with ticks
//!   and labels, and a legend. Message sizes are best read on a log2 axis (1 B … 16 MiB)
//!   and times on a log10 axis (µs … ms), so both scales are built in;
//! - [`BarChart`]: groups of bars (a median with a min–max whisker), one bar per series
//!   in each group;
//! - [`stack`]: several plots one above the other in one document (the testbed's
//!   latency tails, a panel per message size);
//! - [`check_well_formed`]: what the tests hold every plot to.
//!
//! Why by hand rather than a plotting crate (`plotters` was the candidate): a few
//! hundred lines give exactly these two kinds of chart with no dependency; `plotters`
//! lays text out with font metrics, so its SVG backend needs a font backend (a bundled
//! TTF or the system's fontconfig) to draw a labelled axis at all, and its documents
//! would change every plot's content (no tooltips on bars, other structure), which the
//! testbed's report and its tests read.

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

/// The opening of a standalone plot: XML declaration, the `<svg>` root of this size on a
/// white background, and the title centred at `title_x`. The caller closes `</svg>`.
pub fn open_document(width: f64, height: f64, title_x: f64, title: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect x=\"0\" y=\"0\" width=\"{width}\" height=\"{height}\" fill=\"white\"/>\n\
         <text x=\"{title_x:.1}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
        escape(title)
    )
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

        let mut svg = open_document(WIDTH, HEIGHT, LEFT + plot_w / 2.0, &self.title);

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

// ----- bar charts ------------------------------------------------------------------

/// One bar: a median and the min–max of the runs, with a label above it.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    /// The bar's height.
    pub median: f64,
    /// The whisker's bottom.
    pub min: f64,
    /// The whisker's top.
    pub max: f64,
    /// Text above the bar (and in its tooltip).
    pub label: String,
}

/// A group of bars on the horizontal axis: one bar (or none) per series of the chart.
#[derive(Debug, Clone, PartialEq)]
pub struct BarGroup {
    /// The name under the group, on two lines when it has two words or more.
    pub name: String,
    /// One entry per series of the chart, in the order of [`BarChart::series`].
    pub bars: Vec<Option<Bar>>,
}

/// Bars in groups, from zero on a linear axis, with a legend of the series.
#[derive(Debug, Clone, PartialEq)]
pub struct BarChart {
    /// Title above the chart.
    pub title: String,
    /// The vertical axis's title, e.g. `MB/s`.
    pub y_label: String,
    /// The series' names, in the legend; each group has one bar per series.
    pub series: Vec<String>,
    /// The groups, left to right.
    pub groups: Vec<BarGroup>,
}

const BAR_WIDTH: f64 = 900.0;
const BAR_HEIGHT: f64 = 500.0;
const BAR_RIGHT: f64 = 130.0; // room for the legend
const BAR_BOTTOM: f64 = 70.0; // room for two-line group names
const BAR_PALETTE: &[&str] = &["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"];

/// A round top for a linear axis from 0 and its tick step (1-2-5 steps, at most 10).
pub fn nice_axis(max: f64) -> (f64, f64) {
    if !(max.is_finite() && max > 0.0) {
        return (1.0, 0.2);
    }
    let magnitude = 10f64.powf((max / 8.0).log10().floor());
    let step =
        [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * magnitude).find(|s| max / s <= 10.0).unwrap_or(10.0 * magnitude);
    ((max / step).ceil() * step, step)
}

impl BarChart {
    /// Renders the chart as a standalone SVG document.
    pub fn render(&self) -> String {
        let plot_w = BAR_WIDTH - LEFT - BAR_RIGHT;
        let plot_h = BAR_HEIGHT - TOP - BAR_BOTTOM;
        let top = self
            .groups
            .iter()
            .flat_map(|g| g.bars.iter().flatten())
            .map(|b| b.max.max(b.median))
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max);
        let (y_max, step) = nice_axis(top);
        let py = |v: f64| TOP + plot_h - (v.clamp(0.0, y_max) / y_max) * plot_h;

        let mut svg = open_document(BAR_WIDTH, BAR_HEIGHT, LEFT + plot_w / 2.0, &self.title);
        let ticks = (y_max / step).round() as usize;
        for k in 0..=ticks {
            let v = k as f64 * step;
            let y = py(v);
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e0e0e0"/>
<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT + plot_w,
                LEFT - 6.0,
                y + 4.0,
                escape(&format!("{v}"))
            );
        }
        let _ = writeln!(
            svg,
            r#"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>
<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">{}</text>"#,
            TOP + plot_h / 2.0,
            TOP + plot_h / 2.0,
            escape(&self.y_label)
        );
        let group_w = plot_w / self.groups.len().max(1) as f64;
        let bar_w = group_w * 0.7 / self.series.len().max(1) as f64;
        for (g, group) in self.groups.iter().enumerate() {
            let x0 = LEFT + g as f64 * group_w + group_w * 0.15;
            for (k, bar) in group.bars.iter().enumerate() {
                let Some(bar) = bar else { continue };
                let x = x0 + k as f64 * bar_w;
                let y = py(bar.median);
                let cx = x + bar_w / 2.0;
                let series = self.series.get(k).map_or("", String::as_str);
                let _ = writeln!(
                    svg,
                    r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}</title></rect>
<line x1="{cx:.1}" y1="{:.1}" x2="{cx:.1}" y2="{:.1}" stroke="black"/>
<text x="{cx:.1}" y="{:.1}" text-anchor="middle" font-size="9">{}</text>"#,
                    bar_w,
                    (TOP + plot_h - y).max(0.0),
                    BAR_PALETTE[k % BAR_PALETTE.len()],
                    escape(&format!("{} {series}: {}", group.name, bar.label)),
                    py(bar.min),
                    py(bar.max),
                    py(bar.max.max(bar.median)) - 4.0,
                    escape(&bar.label)
                );
            }
            // The group's name under its bars, on two lines when it has two words.
            let cx = LEFT + (g as f64 + 0.5) * group_w;
            let (first, second) = group.name.split_once(' ').unwrap_or((&group.name, ""));
            let _ = writeln!(
                svg,
                r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle"><tspan x="{cx:.1}">{}</tspan><tspan x="{cx:.1}" dy="14">{}</tspan></text>"#,
                TOP + plot_h + 18.0,
                escape(first),
                escape(second)
            );
        }
        for (k, name) in self.series.iter().enumerate() {
            let y = TOP + 10.0 + k as f64 * 20.0;
            let x = LEFT + plot_w + 16.0;
            let _ = writeln!(
                svg,
                r#"<rect x="{x:.1}" y="{:.1}" width="14" height="10" fill="{}"/>
<text x="{:.1}" y="{:.1}">{}</text>"#,
                y - 5.0,
                BAR_PALETTE[k % BAR_PALETTE.len()],
                x + 20.0,
                y + 4.0,
                escape(name)
            );
        }
        svg.push_str("</svg>\n");
        svg
    }
}

// ----- several plots in one document ------------------------------------------------

/// Stacks standalone SVG documents vertically into one document, each as a nested
/// `<svg>` element placed at its offset.
pub fn stack(panels: &[String]) -> String {
    let (width, height) = panels.first().and_then(|p| root_size(p)).unwrap_or((WIDTH, HEIGHT));
    let total = height * panels.len() as f64;
    let mut svg = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" \
         width=\"{width}\" height=\"{total}\" viewBox=\"0 0 {width} {total}\">\n"
    );
    for (i, panel) in panels.iter().enumerate() {
        let body = panel.find("<svg").map_or(panel.as_str(), |at| &panel[at..]);
        svg.push_str(&body.replacen("<svg ", &format!("<svg x=\"0\" y=\"{}\" ", height * i as f64), 1));
    }
    svg.push_str("</svg>\n");
    svg
}

/// The `width` and `height` attributes of a document's root `<svg>` element.
pub fn root_size(svg: &str) -> Option<(f64, f64)> {
    let start = svg.find("<svg")?;
    let tag = &svg[start..start + svg[start..].find('>')?];
    let attribute = |name: &str| -> Option<f64> {
        let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
        tag[at..].split('"').next()?.parse().ok()
    };
    Some((attribute("width")?, attribute("height")?))
}

// ----- checking what we write -------------------------------------------------------

/// Checks that `text` is a well-formed XML document with an `svg` root: one root
/// element, tags closed in order, attributes quoted and not repeated, entity and
/// character references valid, nothing but comments, processing instructions and
/// white space outside the root.
pub fn check_well_formed(text: &str) -> Result<(), String> {
    let mut stack: Vec<&str> = Vec::new();
    let mut roots = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let Some(lt) = rest.find('<') else {
            check_text(rest, !stack.is_empty())?;
            break;
        };
        check_text(&rest[..lt], !stack.is_empty())?;
        rest = &rest[lt..];
        if let Some(body) = rest.strip_prefix("<?") {
            let end = body.find("?>").ok_or("unterminated processing instruction")?;
            rest = &body[end + 2..];
        } else if let Some(body) = rest.strip_prefix("<!--") {
            let end = body.find("-->").ok_or("unterminated comment")?;
            if body[..end].contains("--") {
                return Err("`--` inside a comment".into());
            }
            rest = &body[end + 3..];
        } else if let Some(body) = rest.strip_prefix("<![CDATA[") {
            if stack.is_empty() {
                return Err("CDATA outside the root element".into());
            }
            let end = body.find("]]>").ok_or("unterminated CDATA section")?;
            rest = &body[end + 3..];
        } else if let Some(body) = rest.strip_prefix("<!") {
            if roots > 0 || !stack.is_empty() {
                return Err("a declaration after the root element started".into());
            }
            let end = body.find('>').ok_or("unterminated declaration")?;
            rest = &body[end + 1..];
        } else if let Some(body) = rest.strip_prefix("</") {
            let end = body.find('>').ok_or("unterminated end tag")?;
            let name = body[..end].trim_end();
            match stack.pop() {
                Some(open) if open == name => {}
                open => return Err(format!("</{name}> closes {open:?}")),
            }
            rest = &body[end + 1..];
        } else {
            let (name, empty, after) = start_tag(&rest[1..])?;
            if stack.is_empty() {
                roots += 1;
                if roots > 1 {
                    return Err(format!("a second root element <{name}>"));
                }
                if name != "svg" {
                    return Err(format!("the root element is <{name}>, not <svg>"));
                }
            }
            if !empty {
                stack.push(name);
            }
            rest = after;
        }
    }
    match (stack.last(), roots) {
        (Some(open), _) => Err(format!("<{open}> is never closed")),
        (None, 0) => Err("no root element".into()),
        (None, _) => Ok(()),
    }
}

/// Parses a start tag after its `<`: its name, whether it is empty (`/>`) and the text
/// after it.
fn start_tag(text: &str) -> Result<(&str, bool, &str), String> {
    let name_len = text.find(|c: char| c.is_whitespace() || c == '>' || c == '/').ok_or("unterminated tag")?;
    let name = &text[..name_len];
    if !is_name(name) {
        return Err(format!("bad element name {name:?}"));
    }
    let mut rest = &text[name_len..];
    let mut seen: Vec<&str> = Vec::new();
    loop {
        let trimmed = rest.trim_start();
        let had_space = trimmed.len() < rest.len();
        rest = trimmed;
        if let Some(after) = rest.strip_prefix("/>") {
            return Ok((name, true, after));
        }
        if let Some(after) = rest.strip_prefix('>') {
            return Ok((name, false, after));
        }
        if !had_space {
            return Err(format!("<{name}>: attributes must be separated by white space"));
        }
        let eq = rest.find('=').ok_or_else(|| format!("<{name}>: attribute without a value"))?;
        let attribute = rest[..eq].trim_end();
        if !is_name(attribute) {
            return Err(format!("<{name}>: bad attribute name {attribute:?}"));
        }
        if seen.contains(&attribute) {
            return Err(format!("<{name}>: attribute {attribute} repeated"));
        }
        seen.push(attribute);
        let value = rest[eq + 1..].trim_start();
        let quote = value.chars().next().filter(|c| *c == '"' || *c == '\'');
        let quote = quote.ok_or_else(|| format!("<{name}>: {attribute} is not quoted"))?;
        let end = value[1..].find(quote).ok_or_else(|| format!("<{name}>: {attribute} is not closed"))?;
        let content = &value[1..1 + end];
        if content.contains('<') {
            return Err(format!("<{name}>: `<` in the value of {attribute}"));
        }
        check_references(content)?;
        rest = &value[end + 2..];
    }
}

/// Character data: no stray markup, valid references, and nothing but white space
/// outside the root element.
fn check_text(text: &str, inside: bool) -> Result<(), String> {
    if !inside && !text.trim().is_empty() {
        return Err(format!("text outside the root element: {:?}", text.trim()));
    }
    if text.contains("]]>") {
        return Err("`]]>` in character data".into());
    }
    check_references(text)
}

/// Every `&` starts a predefined entity or a character reference.
fn check_references(text: &str) -> Result<(), String> {
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        rest = &rest[amp + 1..];
        let end = rest.find(';').ok_or("`&` without `;`")?;
        let reference = &rest[..end];
        let valid = match reference.strip_prefix('#') {
            Some(hex) if hex.starts_with('x') => {
                u32::from_str_radix(&hex[1..], 16).ok().and_then(char::from_u32).is_some()
            }
            Some(dec) => dec.parse::<u32>().ok().and_then(char::from_u32).is_some(),
            None => ["amp", "lt", "gt", "quot", "apos"].contains(&reference),
        };
        if !valid {
            return Err(format!("bad reference &{reference};"));
        }
        rest = &rest[end + 1..];
    }
    Ok(())
}

/// An XML name, restricted to what SVG uses: letters, digits, `_`, `-`, `.`, `:`, not
/// starting with a digit, `-` or `.`.
fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn balanced(xml: &str) -> Result<(), String> {
        check_well_formed(xml)
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
    fn axes_get_round_tops_and_steps() {
        assert_eq!(nice_axis(23_000.0), (25_000.0, 5_000.0));
        assert_eq!(nice_axis(3_509.0), (4_000.0, 500.0));
        assert_eq!(nice_axis(1.0), (1.0, 0.1));
        assert_eq!(nice_axis(0.0), (1.0, 0.2));
        assert_eq!(nice_axis(f64::NAN), (1.0, 0.2));
    }

    #[test]
    fn bar_charts_are_well_formed_and_stack() {
        let bar = |m: f64| Some(Bar { median: m, min: m * 0.9, max: m * 1.1, label: format!("{m:.0}") });
        let chart = BarChart {
            title: "t <x>".into(),
            y_label: "MB/s".into(),
            series: vec!["cached".into(), "uncached".into()],
            groups: vec![
                BarGroup { name: "block (best size)".into(), bars: vec![bar(10.0), None] },
                BarGroup { name: "mapped".into(), bars: vec![bar(5.0), bar(2.0)] },
            ],
        };
        let svg = chart.render();
        balanced(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
        assert_eq!(svg.matches("<title>").count(), 3);
        assert!(svg.contains(">block<") && svg.contains(">(best size)<") && svg.contains(">uncached<"));
        assert!(svg.contains("<title>block (best size) cached: 10</title>"), "{svg}");
        let both = stack(&[svg.clone(), sample().render()]);
        balanced(&both).expect("stacked");
        assert_eq!(root_size(&both), Some((900.0, 1000.0)));
        assert_eq!(root_size(&svg), Some((900.0, 500.0)));
    }

    #[test]
    fn escape_handles_all_markup_characters() {
        assert_eq!(escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&apos;");
        assert_eq!(escape("bell\u{7}"), "bell ");
    }

    #[test]
    fn the_xml_checker_tells_good_from_bad() {
        let good = "<?xml version=\"1.0\"?>\n<!-- a plot -->\n<svg a=\"1\" b='x &amp; y'><g><text>1 &lt; 2 &#956;s</text></g><line x=\"1\"/></svg>\n";
        assert_eq!(check_well_formed(good), Ok(()));
        for bad in [
            "<svg><g></svg></g>",
            "<svg>",
            "<svg a=1></svg>",
            "<svg a=\"1\" a=\"2\"></svg>",
            "<svg a=\"1\"b=\"2\"></svg>",
            "<svg>a & b</svg>",
            "<svg>&nbsp;</svg>",
            "<svg></svg><svg></svg>",
            "<html></html>",
            "text<svg></svg>",
            "<svg a=\"<\"></svg>",
            "",
        ] {
            assert!(check_well_formed(bad).is_err(), "{bad:?} passed");
        }
    }
}
