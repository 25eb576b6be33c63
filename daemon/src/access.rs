//! Who may connect to the agent socket: its mode and group, as `tally serve` takes them
//! on its command line (`--socket-mode 0660 --socket-group agents`).

use std::path::Path;

use crate::error::DaemonError;

/// Parse a socket mode written in octal (`0660`, `660`, `0o660`). Only permission bits
/// are accepted (at most `0777`), and the daemon's own user must be able to connect
/// (read and write for the owner).
pub fn parse_socket_mode(text: &str) -> Result<u32, DaemonError> {
    let digits = text.trim();
    let digits = digits.strip_prefix("0o").unwrap_or(digits);
    let bad = |why: &'static str| DaemonError::BadSocketMode {
        text: text.to_string(),
        why,
    };
    if digits.is_empty() || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return Err(bad("write it in octal, like 0660"));
    }
    let mode = u32::from_str_radix(digits, 8).map_err(|_| bad("too large"))?;
    if mode > 0o777 {
        return Err(bad("only permission bits (at most 0777) are allowed"));
    }
    if mode & 0o600 != 0o600 {
        return Err(bad(
            "the owner (the daemon's user) needs read and write, 06xx",
        ));
    }
    Ok(mode)
}

/// The id of a group given by name or number, looked up in `/etc/group`.
pub fn group_id(name: &str) -> Result<u32, DaemonError> {
    group_id_in(name, Path::new("/etc/group"))
}

/// [`group_id`] against another group file (for tests).
pub fn group_id_in(name: &str, group_file: &Path) -> Result<u32, DaemonError> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    let text = std::fs::read_to_string(group_file).map_err(|e| DaemonError::io(group_file, e))?;
    // name:password:gid:members
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            Some((fields.next()?, fields.nth(1)?))
        })
        .find(|(n, _)| *n == name)
        .and_then(|(_, gid)| gid.parse().ok())
        .ok_or_else(|| DaemonError::UnknownGroup {
            name: name.to_string(),
            file: group_file.to_path_buf(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_octal_permission_bits_the_owner_can_use() {
        assert_eq!(parse_socket_mode("0660").ok(), Some(0o660));
        assert_eq!(parse_socket_mode("600").ok(), Some(0o600));
        assert_eq!(parse_socket_mode("0o666").ok(), Some(0o666));
        for bad in ["", "660x", "0968", "4660", "0440", "rw-rw----"] {
            assert!(
                matches!(
                    parse_socket_mode(bad),
                    Err(DaemonError::BadSocketMode { .. })
                ),
                "{bad:?} was accepted"
            );
        }
    }

    #[test]
    fn groups_by_name_or_number() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("group");
        std::fs::write(&file, "root:x:0:\nagents:x:1234:alice,bob\n").expect("write");
        assert_eq!(group_id_in("agents", &file).ok(), Some(1234));
        assert_eq!(group_id_in("77", &file).ok(), Some(77));
        match group_id_in("agent", &file) {
            Err(e @ DaemonError::UnknownGroup { .. }) => {
                assert!(e.to_string().contains("groupadd agent"), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }
}
