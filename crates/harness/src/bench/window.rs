//! A window over a counter that its own readings move: the heap allocation count a process
//! reports costs that process allocations to report. The window is read twice at its start
//! and once at its end, and the cost of one reading is taken off.

/// Readings `a` and `b`, one right after the other, at the window's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountWindow {
    a: u64,
    b: u64,
}

impl CountWindow {
    /// Opens the window with two readings; `None` if the count went down between them (it is
    /// no counter of this process's, or the process restarted).
    pub fn open(a: u64, b: u64) -> Option<Self> {
        (b >= a).then_some(Self { a, b })
    }

    /// What the window counted, given the closing reading `c`: `(c - b) - (b - a)`, never
    /// below zero.
    pub fn close(self, c: u64) -> u64 {
        let reading = self.b - self.a;
        c.saturating_sub(self.b).saturating_sub(reading)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_takes_off_one_reading() {
        let w = CountWindow::open(100, 130).expect("open");
        // 30 per reading: of the 930 after `b`, 30 are the closing reading's own.
        assert_eq!(w.close(1060), 900);
        assert_eq!(w.close(120), 0, "never below zero");
        assert_eq!(CountWindow::open(100, 90), None, "a count that went down");
    }
}
