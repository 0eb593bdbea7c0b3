//! Timestamps in NVIDIA's formats, from a time the caller read (this crate reads no clock).

use std::time::Duration;

/// Civil date (year, month, day) from days since 1970-01-01 (Howard Hinnant's algorithm).
pub fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    (
        y,
        u32::try_from(m).unwrap_or(1),
        u32::try_from(d).unwrap_or(1),
    )
}

struct Parts {
    y: i64,
    m: u32,
    d: u32,
    hh: u64,
    mm: u64,
    ss: u64,
    ms: u32,
}

fn parts(since_epoch: Duration) -> Parts {
    let secs = since_epoch.as_secs();
    let (y, m, d) = civil(i64::try_from(secs / 86_400).unwrap_or(0));
    let s = secs % 86_400;
    Parts {
        y,
        m,
        d,
        hh: s / 3600,
        mm: s / 60 % 60,
        ss: s % 60,
        ms: since_epoch.subsec_millis(),
    }
}

/// `M/D/YYYY HH:MM:SS.mmm` (UTC, no zero padding on month and day): `ctl -N` and the log banner.
pub fn nv_timestamp(since_epoch: Duration) -> String {
    let p = parts(since_epoch);
    format!(
        "{}/{}/{} {:02}:{:02}:{:02}.{:03}",
        p.m, p.d, p.y, p.hh, p.mm, p.ss, p.ms
    )
}

/// `Mon DD YYYY HH:MM:SS.mmm` (UTC): the stamp of each log line.
pub fn log_timestamp(since_epoch: Duration) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let p = parts(since_epoch);
    let mon = MONTHS
        .get((p.m as usize).saturating_sub(1))
        .copied()
        .unwrap_or("???");
    format!(
        "{mon} {:02} {} {:02}:{:02}:{:02}.{:03}",
        p.d, p.y, p.hh, p.mm, p.ss, p.ms
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(19_782), (2024, 2, 29));
        // 2025-05-12 06:08:10.580 UTC
        let t = Duration::from_millis(1_747_030_090_580);
        assert_eq!(nv_timestamp(t), "5/12/2025 06:08:10.580");
        assert_eq!(log_timestamp(t), "May 12 2025 06:08:10.580");
    }
}
