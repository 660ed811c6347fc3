//! Live progress: bars redrawn in place on a terminal, plain periodic lines
//! otherwise (CI logs, pipes).

use crate::state::{lock, Shared, SlotView, State};
use pg_claim_support::thousands;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

pub struct Display {
    tty: bool,
    drawn_lines: usize,
    printed_events: usize,
    last_plain: Option<Instant>,
    last_plain_done: Option<u64>,
    width: usize,
}

/// Items/s of a slot over its recent samples.
fn rate(v: &SlotView) -> f64 {
    match (v.samples.first(), v.samples.last()) {
        (Some(a), Some(b)) if b.0 > a.0 => {
            (b.1.saturating_sub(a.1)) as f64 / b.0.duration_since(a.0).as_secs_f64()
        }
        _ => 0.0,
    }
}

impl Display {
    pub fn new() -> Display {
        Display {
            tty: std::io::stdout().is_terminal(),
            drawn_lines: 0,
            printed_events: 0,
            last_plain: None,
            last_plain_done: None,
            width: 30,
        }
    }

    /// Prints the new events and the progress; `last` forces a final plain
    /// line.
    pub fn draw(&mut self, state: &State, start: Instant, last: bool) {
        let now = Instant::now();
        let mut s = lock(state);
        for v in s.slots.iter_mut() {
            v.samples.push((now, v.done));
            v.samples
                .retain(|(t, _)| now.duration_since(*t) <= Duration::from_millis(1500));
        }
        let mut out = String::new();
        if self.tty && self.drawn_lines > 0 {
            out.push_str(&format!("\x1b[{}A\x1b[J", self.drawn_lines));
        }
        for e in &s.events[self.printed_events..] {
            out.push_str(e);
            out.push('\n');
        }
        self.printed_events = s.events.len();
        let elapsed = start.elapsed().as_secs_f64();
        if self.tty {
            self.bars(&s, elapsed, &mut out);
        } else {
            self.plain(&s, elapsed, now, last, &mut out);
        }
        drop(s);
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(out.as_bytes());
        let _ = o.flush();
    }

    /// A bar per slot, a total and the standbys, redrawn in place.
    fn bars(&mut self, s: &Shared, elapsed: f64, out: &mut String) {
        let (done, total) = totals(s);
        let total_rate: f64 = s.slots.iter().map(rate).sum();
        let mut lines = 0;
        for (i, v) in s.slots.iter().enumerate() {
            let frac = v.done as f64 / v.total.max(1) as f64;
            let filled = ((frac * self.width as f64).round() as usize).min(self.width);
            let who = match (&v.holder, v.token) {
                // lease mode: through a pooler the backend changes, the token does not
                (Some((r, _)), Some(t)) => format!("{r} token {t}"),
                (Some((r, p)), None) => format!("{r} pid {p}"),
                (None, _) if v.finished => "done".to_string(),
                (None, Some(_)) => "given back, not taken yet".to_string(),
                (None, None) => "NO HOLDER".to_string(),
            };
            out.push_str(&format!(
                "slot {i:2} [{}{}] {:5.1}% {:>9}/{:<9} {:>8} items/s  {who}\n",
                "#".repeat(filled),
                ".".repeat(self.width - filled),
                frac * 100.0,
                thousands(v.done),
                thousands(v.total),
                thousands(rate(v) as u64),
            ));
            lines += 1;
        }
        out.push_str(&format!(
            "total   {:>9}/{:<9} {:>8} items/s  elapsed {elapsed:.1}s\n",
            thousands(done),
            thousands(total),
            thousands(total_rate as u64)
        ));
        lines += 1;
        let sb: Vec<String> = s
            .standbys
            .iter()
            .map(|(r, p, st)| match p {
                0 => format!("{r}: {st}"), // lease mode: no backend of its own
                p => format!("{r} pid {p}: {st}"),
            })
            .collect();
        if !sb.is_empty() {
            out.push_str(&format!("standbys: {}\n", sb.join("; ")));
            lines += 1;
        }
        if !s.shares.is_empty() {
            // lease mode: who holds how many slots, and which
            out.push_str(&format!("shares: {}\n", s.shares));
            lines += 1;
        }
        self.drawn_lines = lines;
    }

    /// A progress line every 2 s while the count moves, for logs and pipes.
    fn plain(&mut self, s: &Shared, elapsed: f64, now: Instant, last: bool, out: &mut String) {
        let (done, total) = totals(s);
        let due = self
            .last_plain
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(2));
        if !(due || last) || self.last_plain_done == Some(done) {
            return;
        }
        self.last_plain = Some(now);
        self.last_plain_done = Some(done);
        let total_rate: f64 = s.slots.iter().map(rate).sum();
        let per: Vec<String> = s
            .slots
            .iter()
            .enumerate()
            .map(|(i, v)| {
                format!(
                    "s{i} {:3.0}%",
                    100.0 * v.done as f64 / v.total.max(1) as f64
                )
            })
            .collect();
        out.push_str(&format!(
            "[{elapsed:6.2}s] progress {}/{} ({:.0}%)  {} items/s  | {}\n",
            thousands(done),
            thousands(total),
            100.0 * done as f64 / total.max(1) as f64,
            thousands(total_rate as u64),
            per.join(" ")
        ));
    }
}

/// Items done and items in all, over every slot.
fn totals(s: &Shared) -> (u64, u64) {
    s.slots
        .iter()
        .fold((0, 0), |(d, t), v| (d + v.done, t + v.total))
}
