//! One row of `scripts/bench.sh`'s table: a figure's median beside the
//! median of its yardstick, measured in the same run. Printed as one tagged
//! JSON line (`table-row<TAB>{…}`) that the script collects from every
//! bench; the bench's own lines, with their spread, stay as they are.

/// Prints the row: `measure` took (or reached) `median` `unit`, and
/// `yardstick` `yardstick_median`. `spread` is (p10, p90) where the bench
/// takes enough samples for it.
pub fn row(
    measure: &str,
    unit: &str,
    median: f64,
    spread: Option<(f64, f64)>,
    yardstick: &str,
    yardstick_median: f64,
) {
    let line = serde_json::json!({
        "measure": measure,
        "unit": unit,
        "median": median,
        "p10": spread.map(|s| s.0),
        "p90": spread.map(|s| s.1),
        "yardstick": yardstick,
        "yardstick_median": yardstick_median,
    });
    println!("table-row\t{line}");
}
