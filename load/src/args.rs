//! `tally-load`'s arguments: a handful of `--flag value` pairs, each taken once.

/// A bench tool's handful of `--flag value` arguments (the `tally` CLI is where clap
/// lives). Unknown flags and missing or malformed values are refused.
pub(crate) struct Args {
    flags: Vec<(String, Option<String>)>,
}

impl Args {
    pub(crate) fn parse(
        args: impl Iterator<Item = String>,
        known: &[&str],
        switches: &[&str],
    ) -> Result<Args, String> {
        let mut flags = Vec::new();
        let mut args = args.peekable();
        while let Some(a) = args.next() {
            let Some(name) = a.strip_prefix("--") else {
                return Err(format!("unexpected argument `{a}`"));
            };
            if !known.contains(&name) && !switches.contains(&name) {
                return Err(format!("unknown flag --{name}"));
            }
            if switches.contains(&name) {
                flags.push((name.to_string(), None));
                continue;
            }
            match args.next() {
                Some(v) if !v.starts_with("--") => flags.push((name.to_string(), Some(v))),
                _ => return Err(format!("--{name} needs a value")),
            }
        }
        Ok(Args { flags })
    }

    /// Take flag `name`; every flag must be taken once (see [`Args::done`]).
    pub(crate) fn take(&mut self, name: &str) -> Option<Option<String>> {
        let i = self.flags.iter().position(|(n, _)| n == name)?;
        Some(self.flags.remove(i).1)
    }

    pub(crate) fn value<T: std::str::FromStr>(&mut self, name: &str) -> Result<Option<T>, String> {
        match self.take(name).flatten() {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| format!("--{name}: `{v}` is not valid here")),
        }
    }

    pub(crate) fn required<T: std::str::FromStr>(&mut self, name: &str) -> Result<T, String> {
        self.value(name)?
            .ok_or_else(|| format!("--{name} is required"))
    }

    pub(crate) fn done(self) -> Result<(), String> {
        match self.flags.first() {
            None => Ok(()),
            Some((n, _)) => Err(format!(
                "--{n} is given twice, or is not a flag of this command"
            )),
        }
    }
}
