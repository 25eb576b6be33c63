//! How big a leased slice of a scope's remaining budget is (docs/FLEET.md, "Leased
//! slices"): a host asking alone gets most of what is left; hosts asking together get
//! small slices; the last units are never leased to one host while another is asking:
//! they are served centrally (one database transaction per decision) instead.
//!
//! One dimension at a time (attempts, nanodollars, side effects, polls): the caller
//! sizes each dimension it leases. Pure: the caller counts what is left and who asked.
//!
//! A host deciding inside its slices asks two more things here: whether a use fits in
//! the slice it holds ([`fits_in_slice`]; what a decision uses is
//! [`crate::leased::slice_use`], read off the policy's own fold), and how big a slice
//! must be for a use of `need` units ([`slice_for`]).

use crate::leased::SliceUse;

/// What a host asking for a slice of one dimension may lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SliceSize {
    /// Lease this many units: at least one, never more than what is left.
    Lease(u64),
    /// Lease nothing: decide on the scope centrally, in the database, one decision at a
    /// time (nothing is left, or too little to split among the hosts asking).
    Central,
}

/// The slice for one host of a scope with `left` units unleased and unspent, asked for
/// by `holders` distinct hosts recently (the asker included; 0 counts as 1), no slice
/// smaller than `floor` worth a lease (0 counts as 1).
///
/// * alone: three quarters of what is left, rounded up (at least `floor`, or all that
///   is left when less);
/// * with others: what is left halved (the other half stays for the database and for
///   hosts that arrive), split evenly among the hosts; [`SliceSize::Central`] when that
///   is less than `floor`. With two or more hosts no slice is more than a quarter of
///   what is left, so one host never holds the last units while another asks.
pub fn slice_size(left: u64, holders: u64, floor: u64) -> SliceSize {
    let floor = floor.max(1);
    if left == 0 {
        return SliceSize::Central;
    }
    if holders <= 1 {
        let most = left - left / 4;
        return SliceSize::Lease(most.max(floor.min(left)));
    }
    let share = left / 2 / holders;
    if share < floor {
        SliceSize::Central
    } else {
        SliceSize::Lease(share)
    }
}

/// Whether a use of `need` still fits in a slice that covers `granted` of which `used`
/// is used, in every dimension: the one test a host makes before deciding inside its
/// slices (no: refill, or decide centrally).
pub fn fits_in_slice(need: &SliceUse, used: &SliceUse, granted: &SliceUse) -> bool {
    let (n, u, g) = (need.each(), used.each(), granted.each());
    (0..4).all(|d| u[d].checked_add(n[d]).is_some_and(|total| total <= g[d]))
}

/// The slice of one dimension a host asks for when it must cover a use of `need` units:
/// [`slice_size`], raised to `need` when the host asks alone and `need` is left; with
/// others asking, a use bigger than the share is served centrally ([`SliceSize::Central`]),
/// so no slice is more than a quarter of what is left. `need` 0: [`slice_size`] as is.
pub fn slice_for(left: u64, holders: u64, floor: u64, need: u64) -> SliceSize {
    match slice_size(left, holders, floor) {
        SliceSize::Lease(n) if n >= need => SliceSize::Lease(n),
        SliceSize::Lease(_) if holders <= 1 && need <= left => SliceSize::Lease(need),
        _ => SliceSize::Central,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_for_a_use_covers_it_or_is_central() {
        assert_eq!(slice_for(100, 1, 5, 90), SliceSize::Lease(90));
        assert_eq!(slice_for(100, 1, 5, 10), SliceSize::Lease(75));
        assert_eq!(slice_for(100, 1, 5, 101), SliceSize::Central);
        assert_eq!(slice_for(1_000, 2, 5, 250), SliceSize::Lease(250));
        assert_eq!(slice_for(1_000, 2, 5, 251), SliceSize::Central);
        for left in 0..120u64 {
            for holders in 0..5u64 {
                for need in 0..40u64 {
                    if let SliceSize::Lease(n) = slice_for(left, holders, 3, need) {
                        assert!(n >= need && n <= left && n >= 1, "{left} {holders} {need}");
                        if holders >= 2 {
                            assert!(n * 4 <= left, "{left} {holders} {need}: {n}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_use_fits_in_a_slice_only_within_every_dimension() {
        let slice = SliceUse {
            attempts: 5,
            nanos: 100,
            ..SliceUse::default()
        };
        let used = SliceUse {
            attempts: 4,
            nanos: 93,
            ..SliceUse::default()
        };
        let need = |attempts, nanos, effects| SliceUse {
            attempts,
            nanos,
            side_effects: effects,
            polls: 0,
        };
        assert!(fits_in_slice(&need(1, 7, 0), &used, &slice));
        assert!(!fits_in_slice(&need(2, 7, 0), &used, &slice));
        assert!(!fits_in_slice(&need(1, 8, 0), &used, &slice));
        assert!(!fits_in_slice(&need(0, 0, 1), &used, &slice));
        let full = need(u64::MAX, 0, 0);
        assert!(!fits_in_slice(&need(1, 0, 0), &full, &full));
    }

    #[test]
    fn one_host_gets_most_of_what_is_left() {
        assert_eq!(slice_size(100, 1, 5), SliceSize::Lease(75));
        assert_eq!(slice_size(100, 0, 5), SliceSize::Lease(75));
        assert_eq!(slice_size(3, 1, 1), SliceSize::Lease(3));
        // Less than the floor left, nobody else asking: all of it.
        assert_eq!(slice_size(4, 1, 10), SliceSize::Lease(4));
        assert_eq!(slice_size(1, 1, 0), SliceSize::Lease(1));
    }

    #[test]
    fn many_hosts_get_small_slices() {
        assert_eq!(slice_size(1_000, 2, 5), SliceSize::Lease(250));
        assert_eq!(slice_size(1_000, 10, 5), SliceSize::Lease(50));
        assert_eq!(slice_size(1_000, 100, 5), SliceSize::Lease(5));
        assert_eq!(slice_size(1_000, 101, 5), SliceSize::Central);
    }

    #[test]
    fn the_last_units_are_served_centrally_while_another_host_asks() {
        assert_eq!(slice_size(0, 1, 1), SliceSize::Central);
        assert_eq!(slice_size(3, 2, 1), SliceSize::Central);
        assert_eq!(slice_size(7, 3, 2), SliceSize::Central);
    }

    #[test]
    fn a_slice_is_never_more_than_what_is_left_nor_all_of_it_when_shared() {
        for left in 0..200u64 {
            for holders in 0..12u64 {
                for floor in 0..20u64 {
                    match slice_size(left, holders, floor) {
                        SliceSize::Lease(n) => {
                            assert!(n >= 1 && n <= left, "{left} {holders} {floor}: {n}");
                            if holders >= 2 {
                                assert!(n * 4 <= left, "{left} {holders} {floor}: {n}");
                                assert!(n >= floor, "{left} {holders} {floor}: {n}");
                            }
                        }
                        SliceSize::Central => {
                            assert!(left == 0 || holders >= 2, "{left} {holders} {floor}")
                        }
                    }
                }
            }
        }
    }
}
