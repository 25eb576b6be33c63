//! How big a leased slice of a scope's remaining budget is (docs/FLEET.md, "Leased
//! slices"): a host asking alone gets most of what is left; hosts asking together get
//! small slices; the last units are never leased to one host while another is asking:
//! they are served centrally (one database transaction per decision) instead.
//!
//! One dimension at a time (attempts, nanodollars, side effects, polls): the caller
//! sizes each dimension it leases. Pure: the caller counts what is left and who asked.

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

#[cfg(test)]
mod tests {
    use super::*;

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
