//! Where the CPU goes during a timed window: the server backends of the
//! benchmark's database, PgBouncer, this client process, and the whole
//! machine, from `/proc` (Linux). Times are in seconds of CPU.

use postgres::Client;
use std::collections::HashMap;
use std::fs;

/// The kernel's fixed unit of `/proc/<pid>/stat` times (USER_HZ, 100 on
/// every Linux architecture the benchmark runs on).
const TICKS_PER_SECOND: f64 = 100.0;

/// user + system CPU seconds of a process, if it still exists.
fn process_cpu(pid: &str) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // the command name (2nd field) is in parentheses and may hold spaces
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // fields 14 and 15 of the line: utime and stime, 12th and 13th after ')'
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / TICKS_PER_SECOND)
}

/// Busy and total CPU seconds of the whole machine (all cores).
fn machine_cpu() -> Option<(f64, f64)> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let idle = v.get(3)? + v.get(4).unwrap_or(&0.0);
    let total: f64 = v.iter().take(8).sum();
    Some(((total - idle) / TICKS_PER_SECOND, total / TICKS_PER_SECOND))
}

/// One reading of every counter.
pub struct Sample {
    backends: HashMap<i32, f64>,
    pooler: Option<f64>,
    client: f64,
    machine: (f64, f64),
}

/// The client backends of the connected database, other than the asking
/// session: the pooler's server connections.
fn backend_pids(admin: &mut Client) -> Result<Vec<i32>, postgres::Error> {
    Ok(admin
        .query(
            "SELECT pid FROM pg_stat_activity
              WHERE datname = current_database() AND backend_type = 'client backend'
                AND pid <> pg_backend_pid()",
            &[],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// Reads every counter now.
pub fn sample(admin: &mut Client, pooler_pid: Option<&str>) -> Result<Sample, postgres::Error> {
    let pids = backend_pids(admin)?;
    Ok(Sample {
        backends: pids
            .into_iter()
            .filter_map(|p| process_cpu(&p.to_string()).map(|c| (p, c)))
            .collect(),
        pooler: pooler_pid.and_then(process_cpu),
        client: process_cpu("self").unwrap_or(0.0),
        machine: machine_cpu().unwrap_or((0.0, 0.0)),
    })
}

/// CPU used between two samples, in seconds, and the machine's share busy.
#[derive(Clone, Copy, Default)]
pub struct Used {
    pub server: f64,
    pub pooler: Option<f64>,
    pub client: f64,
    /// Busy share of all cores, 0..1 (includes other work on the machine).
    pub machine_busy: f64,
}

/// What was used from `a` to `b`. A backend that appeared in between
/// counts from zero; one that ended in between is not counted.
pub fn used(a: &Sample, b: &Sample) -> Used {
    let server = b
        .backends
        .iter()
        .map(|(pid, cb)| cb - a.backends.get(pid).copied().unwrap_or(0.0))
        .sum();
    let (busy, total) = (b.machine.0 - a.machine.0, b.machine.1 - a.machine.1);
    Used {
        server,
        pooler: match (a.pooler, b.pooler) {
            (Some(x), Some(y)) => Some(y - x),
            _ => None,
        },
        client: b.client - a.client,
        machine_busy: if total > 0.0 { busy / total } else { 0.0 },
    }
}

/// PgBouncer's pid from its pid file.
pub fn pid_from_file(path: &str) -> Option<String> {
    fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}
