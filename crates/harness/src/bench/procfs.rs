//! A process's footprint read from `/proc`: resident memory (`/proc/PID/status` `VmRSS`),
//! CPU time (`/proc/PID/stat` utime + stime, in clock ticks) and open descriptors
//! (`/proc/PID/fd`). [`Watch`] turns samples over a window into [`Usage`]: CPU% over the
//! window, and the peak RSS and descriptor count seen in it. Also the machine's count of TCP
//! connections accepted (`/proc/net/snmp` `Tcp: PassiveOpens`), which tells how many
//! connections a formation took for its pairs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::HarnessError;

/// One reading of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcSample {
    /// `VmRSS`, KiB.
    pub rss_kib: u64,
    /// utime + stime, clock ticks.
    pub cpu_ticks: u64,
    /// Entries of `/proc/PID/fd`.
    pub fds: usize,
}

/// `VmRSS` in KiB from the text of `/proc/PID/status`.
pub fn parse_vm_rss_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut words = line["VmRSS:".len()..].split_whitespace();
    let kib = words.next()?.parse().ok()?;
    (words.next() == Some("kB")).then_some(kib)
}

/// utime + stime (clock ticks) from the text of `/proc/PID/stat`. The command name (field 2)
/// is in parentheses and may hold spaces or `)`, so fields are counted after the *last* `)`:
/// there the state is field 3, utime field 14 and stime field 15.
pub fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The value of `Tcp:` field `name` in the text of `/proc/net/snmp` (a line of names, then a
/// line of values, both starting with `Tcp:`).
pub fn parse_snmp_tcp(snmp: &str, name: &str) -> Option<u64> {
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let names = tcp.next()?.split_whitespace();
    let values = tcp.next()?.split_whitespace();
    let (_, value) = names.zip(values).find(|(n, _)| *n == name)?;
    value.parse().ok()
}

/// TCP connections accepted on this machine (in this network namespace) since it started;
/// `None` if `/proc/net/snmp` cannot be read.
pub fn tcp_passive_opens() -> Option<u64> {
    let snmp = std::fs::read_to_string("/proc/net/snmp").ok()?;
    parse_snmp_tcp(&snmp, "PassiveOpens")
}

/// TCP connections accepted since a reading of [`tcp_passive_opens`] (`None` if either reading
/// failed).
pub fn tcp_passive_opens_since(before: Option<u64>) -> Option<u64> {
    before
        .zip(tcp_passive_opens())
        .map(|(a, b)| b.saturating_sub(a))
}

/// Clock ticks per second, the unit of `/proc/PID/stat` times.
pub fn clock_ticks_per_sec() -> u64 {
    // SAFETY: sysconf only reads a constant of the C library; it has no preconditions.
    let tck = unsafe { nix::libc::sysconf(nix::libc::_SC_CLK_TCK) };
    // USER_HZ is 100 on every Linux architecture in use; fall back to it if sysconf fails.
    u64::try_from(tck).ok().filter(|t| *t > 0).unwrap_or(100)
}

/// Reads process `pid` now.
pub fn sample(pid: u32) -> Result<ProcSample, HarnessError> {
    let dir = PathBuf::from(format!("/proc/{pid}"));
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).map_err(HarnessError::io(
            "read",
            path,
            "the process has probably exited",
        ))
    };
    let status = read("status")?;
    let stat = read("stat")?;
    let rss_kib = parse_vm_rss_kib(&status)
        .ok_or_else(|| HarnessError::parse("/proc/PID/status", "no VmRSS line", &status))?;
    let cpu_ticks = parse_cpu_ticks(&stat)
        .ok_or_else(|| HarnessError::parse("/proc/PID/stat", "no utime/stime fields", &stat))?;
    let fd_dir = dir.join("fd");
    let fds = std::fs::read_dir(&fd_dir)
        .map_err(HarnessError::io(
            "list",
            fd_dir,
            "reading another user's descriptors needs the same user or root",
        ))?
        .count();
    Ok(ProcSample {
        rss_kib,
        cpu_ticks,
        fds,
    })
}

/// One process's footprint over a window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    /// Peak resident memory seen, MiB.
    pub rss_mib: f64,
    /// CPU time over the window / the window, in percent of one CPU.
    pub cpu_pct: f64,
    /// Peak open descriptors seen.
    pub fds: usize,
}

/// CPU% of one CPU for `ticks` clock ticks used over `window`.
pub fn cpu_percent(ticks: u64, ticks_per_sec: u64, window: Duration) -> f64 {
    let secs = window.as_secs_f64();
    if secs <= 0.0 || ticks_per_sec == 0 {
        return 0.0;
    }
    ticks as f64 / ticks_per_sec as f64 / secs * 100.0
}

/// Samples a set of processes from [`Watch::start`] to [`Watch::finish`]; call
/// [`Watch::poll`] in between to catch peaks.
#[derive(Debug)]
pub struct Watch {
    pids: Vec<u32>,
    first: Vec<ProcSample>,
    peak_rss_kib: Vec<u64>,
    peak_fds: Vec<usize>,
    started: Instant,
}

impl Watch {
    /// Takes the first sample of every process.
    pub fn start(pids: &[u32]) -> Result<Self, HarnessError> {
        let first = pids
            .iter()
            .map(|p| sample(*p))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            pids: pids.to_vec(),
            peak_rss_kib: first.iter().map(|s| s.rss_kib).collect(),
            peak_fds: first.iter().map(|s| s.fds).collect(),
            first,
            started: Instant::now(),
        })
    }

    /// Samples again and keeps the peaks (a process that is gone is skipped here and fails
    /// [`Watch::finish`]).
    pub fn poll(&mut self) {
        for (i, pid) in self.pids.iter().enumerate() {
            if let Ok(s) = sample(*pid) {
                self.peak_rss_kib[i] = self.peak_rss_kib[i].max(s.rss_kib);
                self.peak_fds[i] = self.peak_fds[i].max(s.fds);
            }
        }
    }

    /// The last sample: each process's usage over the whole window, in the order given.
    pub fn finish(mut self) -> Result<Vec<Usage>, HarnessError> {
        let window = self.started.elapsed();
        let tck = clock_ticks_per_sec();
        let mut out = Vec::with_capacity(self.pids.len());
        for (i, pid) in self.pids.iter().enumerate() {
            let last = sample(*pid)?;
            self.peak_rss_kib[i] = self.peak_rss_kib[i].max(last.rss_kib);
            self.peak_fds[i] = self.peak_fds[i].max(last.fds);
            out.push(Usage {
                rss_mib: self.peak_rss_kib[i] as f64 / 1024.0,
                cpu_pct: cpu_percent(
                    last.cpu_ticks.saturating_sub(self.first[i].cpu_ticks),
                    tck,
                    window,
                ),
                fds: self.peak_fds[i],
            });
        }
        Ok(out)
    }

    /// Samples every `interval` for `window`, then finishes.
    pub fn over(
        pids: &[u32],
        window: Duration,
        interval: Duration,
    ) -> Result<Vec<Usage>, HarnessError> {
        let mut w = Self::start(pids)?;
        let end = Instant::now() + window;
        while Instant::now() < end {
            std::thread::sleep(interval.min(end.saturating_duration_since(Instant::now())));
            w.poll();
        }
        w.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Trimmed from a real `/proc/PID/status`.
    const STATUS: &str = "Name:\topenimex\nUmask:\t0022\nState:\tS (sleeping)\n\
        VmPeak:\t  812345 kB\nVmSize:\t  811000 kB\nVmHWM:\t   12000 kB\nVmRSS:\t   10936 kB\n\
        RssAnon:\t    4000 kB\nThreads:\t4\n";
    /// A real `/proc/PID/stat` line, with a command name holding a space and a `)`.
    const STAT: &str = "4242 (open imex) x) S 1 4242 4242 0 -1 4194560 1480 0 0 0 \
        37 21 0 0 20 0 4 0 123456 830472192 2734 18446744073709551615 1 1 0 0 0 0 0 4096 \
        17664 0 0 0 17 1 0 0 0 0 0";

    #[test]
    fn status_rss() {
        assert_eq!(parse_vm_rss_kib(STATUS), Some(10936));
        assert_eq!(parse_vm_rss_kib("Name:\tx\n"), None);
        assert_eq!(parse_vm_rss_kib("VmRSS:\t12 MB\n"), None);
    }

    #[test]
    fn snmp_tcp_field() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm RtoMin ActiveOpens \
                    PassiveOpens AttemptFails\nTcp: 1 200 29835 14241 19600\nUdp: InDatagrams\n\
                    Udp: 7\n";
        assert_eq!(parse_snmp_tcp(snmp, "PassiveOpens"), Some(14241));
        assert_eq!(parse_snmp_tcp(snmp, "ActiveOpens"), Some(29835));
        assert_eq!(parse_snmp_tcp(snmp, "InDatagrams"), None);
        assert_eq!(parse_snmp_tcp("Tcp: PassiveOpens\n", "PassiveOpens"), None);
        assert!(
            tcp_passive_opens().is_some(),
            "this machine's /proc/net/snmp"
        );
    }

    #[test]
    fn stat_cpu_ticks() {
        assert_eq!(parse_cpu_ticks(STAT), Some(37 + 21));
        assert_eq!(parse_cpu_ticks("4242 (x) S 1 2"), None);
        assert_eq!(parse_cpu_ticks("no parenthesis"), None);
    }

    #[test]
    fn cpu_percent_of_one_cpu() {
        let pct = cpu_percent(50, 100, Duration::from_secs(5));
        assert!((pct - 10.0).abs() < 1e-9);
        assert_eq!(cpu_percent(5, 100, Duration::ZERO), 0.0);
    }

    #[test]
    fn this_process_can_be_watched() -> Result<(), HarnessError> {
        let me = std::process::id();
        let s = sample(me)?;
        assert!(s.rss_kib > 0 && s.fds > 0);
        let usage = Watch::over(&[me], Duration::from_millis(30), Duration::from_millis(10))?;
        assert_eq!(usage.len(), 1);
        assert!(usage[0].rss_mib > 0.0 && usage[0].cpu_pct >= 0.0);
        Ok(())
    }
}
