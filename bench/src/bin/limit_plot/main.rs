//! The plot of `bench/72-limit.sh` (docs/limit-throughput.svg): reads the
//! run's medians on stdin and writes the SVG to stdout, drawn by
//! `pg_claim_bench::plot`. The input: the title, the subtitle, then one line
//! per scheme, `label<TAB>#rrggbb<TAB>W:items/s W:items/s ...`.

use pg_claim_bench::plot::{svg, Chart, Series};
use std::io::Read;

fn parse(input: &str) -> Result<Chart, String> {
    let mut lines = input.lines();
    let title = lines.next().ok_or("no title line")?.to_string();
    let subtitle = lines.next().ok_or("no subtitle line")?.to_string();
    let mut series = Vec::new();
    let mut workers: Vec<usize> = Vec::new();
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let mut f = line.split('\t');
        let (Some(label), Some(color), Some(pts)) = (f.next(), f.next(), f.next()) else {
            return Err(format!("not label<TAB>colour<TAB>points: {line:?}"));
        };
        let mut points = Vec::new();
        for p in pts.split_whitespace() {
            let (w, v) = p
                .split_once(':')
                .ok_or_else(|| format!("not W:value: {p:?}"))?;
            let w: usize = w.parse().map_err(|e| format!("W {w:?}: {e}"))?;
            let v: f64 = v.parse().map_err(|e| format!("value {v:?}: {e}"))?;
            if !workers.contains(&w) {
                workers.push(w);
            }
            points.push((w, v));
        }
        series.push(Series {
            label: label.to_string(),
            color: color.to_string(),
            points,
            dashed: false,
        });
    }
    if series.is_empty() {
        return Err("no series".to_string());
    }
    workers.sort_unstable();
    Ok(Chart {
        title,
        subtitle,
        workers,
        y_label: "items/s".to_string(),
        series,
    })
}

fn main() {
    let mut input = String::new();
    let chart = std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| e.to_string())
        .and_then(|_| parse(&input));
    match chart {
        Ok(chart) => print!("{}", svg(&chart)),
        Err(e) => {
            eprintln!("limit_plot: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn series_and_workers_from_the_input() {
        let c = parse("t\ns\na (x)\t#000000\t8:10 32:20\nb\t#111111\t128:5 8:1\n").unwrap();
        assert_eq!(c.workers, vec![8, 32, 128]);
        assert_eq!(c.series.len(), 2);
        assert_eq!(c.series[1].points, vec![(128, 5.0), (8, 1.0)]);
        assert!(parse("t\ns\n").is_err());
        assert!(parse("t\ns\na\t#000000\t8-10\n").is_err());
    }
}
