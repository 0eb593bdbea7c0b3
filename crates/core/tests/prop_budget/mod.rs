//! The case budget of the property suites, shared by every crate's suite (included by path):
//! each suite names its count in CI as a constant, and `PROPTEST_CASES=N` replaces it for a
//! longer run. Failures are not written to regression files: the smallest failing input is
//! printed, and the suite is re-run with it by hand.

use proptest::test_runner::Config;

/// The runner configuration for a property with `default` cases in CI.
pub(crate) fn budget(default: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default);
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}
