//! Line charts as SVG: a rate (items/s) against the number of workers W on a
//! log2 axis, one line per series, the legend on the right. `queue_bench`
//! (docs/queue-throughput.svg) and `elastic_bench`
//! (docs/elastic-throughput.svg) draw their plots with it.

use pg_claim_support::thousands;
use std::fmt::Write as _;

/// One line of a chart.
pub struct Series {
    /// The legend's text; a part from " (" on is printed as a smaller
    /// second line.
    pub label: String,
    /// The line's colour (`#rrggbb`).
    pub color: String,
    /// (W, value) in the order the line joins them.
    pub points: Vec<(usize, f64)>,
    /// A dashed line without points: a bound rather than a measurement.
    pub dashed: bool,
}

/// A chart: its two heading lines, the W values on the x axis, the y
/// axis's name and the lines.
pub struct Chart {
    pub title: String,
    pub subtitle: String,
    pub workers: Vec<usize>,
    pub y_label: String,
    pub series: Vec<Series>,
}

/// The chart as an SVG document.
pub fn svg(chart: &Chart) -> String {
    let (w, h) = (760.0f64, 440.0f64);
    let (left, right, top, bottom) = (80.0, 250.0, 50.0, 60.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let xs: Vec<f64> = chart.workers.iter().map(|&v| (v as f64).log2()).collect();
    let (xmin, xmax) = (
        xs.iter().cloned().fold(f64::INFINITY, f64::min),
        xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
    );
    let ymax_data = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0, f64::max)
        .max(1.0);
    let step = nice_step(ymax_data / 5.0);
    let ymax = (ymax_data / step).ceil() * step;
    let x_of = |v: usize| {
        let lx = (v as f64).log2();
        if xmax > xmin {
            left + (lx - xmin) / (xmax - xmin) * pw
        } else {
            left + pw / 2.0
        }
    };
    let y_of = |v: f64| top + ph - v / ymax * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="22" font-size="15" font-weight="bold">{}</text>"#,
        chart.title
    );
    let _ = writeln!(
        s,
        r##"<text x="{left}" y="38" font-size="11" fill="#555">{}</text>"##,
        chart.subtitle
    );
    let mut yv = 0.0;
    while yv <= ymax + step / 2.0 {
        let y = y_of(yv);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            left + pw,
            left - 6.0,
            y + 4.0,
            thousands(yv as u64)
        );
        yv += step;
    }
    for &wv in &chart.workers {
        let x = x_of(wv);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{:.1}" stroke="#eee"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{wv}</text>"##,
            top + ph,
            top + ph + 18.0
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">workers W (log scale)</text>"#,
        left + pw / 2.0,
        h - 15.0
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">{}</text>"#,
        top + ph / 2.0,
        top + ph / 2.0,
        chart.y_label
    );
    for (k, series) in chart.series.iter().enumerate() {
        let pts: Vec<(f64, f64)> = series
            .points
            .iter()
            .map(|&(wv, v)| (x_of(wv), y_of(v)))
            .collect();
        let path: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let col = &series.color;
        let dash = if series.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{col}" stroke-width="2.5"{dash}/>"#,
            path.join(" ")
        );
        for (x, y) in pts.iter().filter(|_| !series.dashed) {
            let _ = writeln!(
                s,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{col}"/>"#
            );
        }
        let ly = top + 10.0 + k as f64 * 40.0;
        let lx = left + pw + 15.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{:.1}" y2="{ly}" stroke="{col}" stroke-width="3"{dash}/>"#,
            lx + 22.0
        );
        let (a, b) = series
            .label
            .split_once(" (")
            .unwrap_or((series.label.as_str(), ""));
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 28.0,
            ly + 4.0,
            a
        );
        if !b.is_empty() {
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" font-size="10" fill="#555">({}</text>"##,
                lx + 28.0,
                ly + 18.0,
                b
            );
        }
    }
    let _ = writeln!(s, "</svg>");
    s
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let p = 10f64.powf(raw.max(1.0).log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= raw {
            return m * p;
        }
    }
    10.0 * p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(0.5), 1.0);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(1234.0), 2000.0);
        assert_eq!(nice_step(5000.0), 5000.0);
        assert_eq!(nice_step(5001.0), 10000.0);
    }

    #[test]
    fn one_polyline_and_legend_entry_per_series() {
        let chart = Chart {
            title: "t".into(),
            subtitle: "s".into(),
            workers: vec![4, 8, 16],
            y_label: "items/s".into(),
            series: vec![
                Series {
                    label: "a (first)".into(),
                    color: "#000000".into(),
                    points: vec![(4, 1.0), (8, 2.0), (16, 4.0)],
                    dashed: false,
                },
                Series {
                    label: "b".into(),
                    color: "#ffffff".into(),
                    points: vec![(4, 3.0)],
                    dashed: true,
                },
            ],
        };
        let s = svg(&chart);
        assert_eq!(s.matches("<polyline").count(), 2);
        assert_eq!(s.matches("<circle").count(), 3);
        assert_eq!(s.matches("stroke-dasharray").count(), 2);
        assert!(s.contains(">(first)</text>"));
        assert!(s.ends_with("</svg>\n"));
    }
}
