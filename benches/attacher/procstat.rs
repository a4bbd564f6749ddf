//! `/proc/<pid>/stat` as far as the outages of P7 need it.

/// The command name, state and parent pid of a `/proc/<pid>/stat` text (the
/// name is in parentheses and may hold spaces and parentheses itself).
pub fn parse_stat(stat: &str) -> Option<(String, char, u32)> {
    let (head, rest) = stat.rsplit_once(')')?;
    let (_, comm) = head.split_once('(')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((comm.to_owned(), state, ppid))
}

// Also compiled into the benchmark, which cargo builds with cfg(test) but no
// test harness: there the #[test]s are dropped (they run in attacher_units).
#[cfg(test)]
#[allow(unused_imports, dead_code)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_parsed_past_the_command_name() {
        assert_eq!(
            parse_stat("4242 (kube-apiserver) S 17 4242 17 0 -1"),
            Some(("kube-apiserver".into(), 'S', 17))
        );
        // A command name with a space and a parenthesis.
        assert_eq!(parse_stat("7 (a) b) Z 1 7"), Some(("a) b".into(), 'Z', 1)));
        assert_eq!(parse_stat("garbage"), None);
    }
}
