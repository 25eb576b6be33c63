//! The gate's policy file (`Policy::from_toml`, also run by `tally verify --auditor-key` on
//! the policy text a ledger records, which a writer could have forged): never panics;
//! whatever is accepted prints (`to_toml`, what `tally policy check` shows) as a policy
//! that is accepted again and is the same policy.
#![no_main]
use tally_policy::Policy;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(policy) = Policy::from_toml(text) else {
        return;
    };
    let printed = policy.to_toml();
    let again = Policy::from_toml(&printed)
        .unwrap_or_else(|e| panic!("the printed policy is refused: {e}\n{printed}"));
    assert_eq!(again, policy, "{printed}");
});
