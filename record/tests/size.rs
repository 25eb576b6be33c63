//! A `Decision` stays small: the verifier's workers read millions and hand each to the
//! fold on another core, and the gate and the proxy queue them. Its rare parts (`budget`,
//! `scope`, `usage`, `request`, `slice`) are boxed; a new rare part should be too.

use tally_record::Decision;

#[test]
fn a_decision_is_at_most_a_kibibyte() {
    let size = std::mem::size_of::<Decision>();
    assert!(
        size <= 1024,
        "a Decision is {size} bytes; box its rare parts"
    );
}
