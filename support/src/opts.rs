//! Command-line options of the demo and the benchmarks.

use std::collections::HashMap;

/// Command-line options of the form `--name value` or `--name=value`, plus
/// boolean flags (`--name` alone).
#[derive(Debug, Default)]
pub struct Opts {
    values: HashMap<String, String>,
}

impl Opts {
    /// Parses `args` (without the program name). `flags` are the options that
    /// take no value; every other option needs one.
    pub fn parse(args: impl IntoIterator<Item = String>, flags: &[&str]) -> Result<Opts, String> {
        let mut values = HashMap::new();
        let mut it = args.into_iter();
        while let Some(a) = it.next() {
            let Some(body) = a.strip_prefix("--") else {
                return Err(format!("unexpected argument {a:?}"));
            };
            if let Some((k, v)) = body.split_once('=') {
                values.insert(k.to_string(), v.to_string());
            } else if flags.contains(&body) {
                values.insert(body.to_string(), "true".to_string());
            } else {
                let v = it
                    .next()
                    .ok_or_else(|| format!("option --{body} needs a value"))?;
                values.insert(body.to_string(), v);
            }
        }
        Ok(Opts { values })
    }

    /// Fails when an option outside `known` was given.
    pub fn check_known(&self, known: &[&str]) -> Result<(), String> {
        for k in self.values.keys() {
            if !known.contains(&k.as_str()) {
                return Err(format!("unknown option --{k}"));
            }
        }
        Ok(())
    }

    /// The option's value parsed as `T`, or `default` when absent.
    pub fn get<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        match self.values.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("invalid value for --{name}: {v:?}")),
        }
    }

    /// The option's raw value, if given.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// Whether the flag was given.
    pub fn flag(&self, name: &str) -> bool {
        self.values.get(name).is_some_and(|v| v == "true")
    }
}

/// Parses a comma-separated list of positive integers, e.g. `1,2,4,8`.
pub fn parse_list(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| format!("invalid list element {x:?} in {s:?}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opts_parse_values_and_flags() {
        let o = Opts::parse(
            ["--items", "10", "--workers=3", "--no-kill"].map(String::from),
            &["no-kill"],
        )
        .unwrap();
        assert_eq!(o.get("items", 0usize).unwrap(), 10);
        assert_eq!(o.get("workers", 0usize).unwrap(), 3);
        assert_eq!(o.get("standbys", 7usize).unwrap(), 7);
        assert!(o.flag("no-kill"));
        assert!(o.check_known(&["items", "workers", "no-kill"]).is_ok());
        assert!(o.check_known(&["items"]).is_err());
        assert!(o.get("items", 0u8).is_ok());
        assert!(Opts::parse(["--items".to_string()], &[]).is_err());
        assert!(Opts::parse(["items".to_string()], &[]).is_err());
        let bad = Opts::parse(["--items=x".to_string()], &[]).unwrap();
        assert!(bad.get("items", 0usize).is_err());
    }

    #[test]
    fn lists() {
        assert_eq!(parse_list("1, 2,4").unwrap(), vec![1, 2, 4]);
        assert!(parse_list("1,0").is_err());
        assert!(parse_list("a").is_err());
    }
}
