//! The main loop: virtual time advances to the next event or node timer, and after every input
//! each node's actions (and its driver's events) are drained until all are quiet, as a node's
//! contract asks. Also the conditions scenarios wait for (`all_up`, `settled`).

use std::cmp::Reverse;
use std::time::{Duration, Instant};

use openimex_core::*;

use super::World;

impl World {
    /// Advance to the next delivery or timer (at most to `limit`) and process it.
    pub fn step(&mut self, limit: Instant) -> bool {
        let q = self.queue.peek().map(|Reverse(e)| e.at);
        let t = self
            .slots
            .iter()
            .filter_map(|s| s.daemon.as_ref())
            .filter_map(|d| d.node.poll_timeout())
            .min();
        let next = match (q, t) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let Some(next) = next.filter(|t| *t <= limit) else {
            self.now = self.now.max(limit);
            self.check_deadlines();
            return false;
        };
        self.now = self.now.max(next);
        self.stats.steps += 1;
        while let Some(Reverse(e)) = self.queue.peek() {
            if e.at > self.now {
                break;
            }
            let Reverse(e) = self.queue.pop().unwrap();
            self.handle(e.ev);
            self.pump();
        }
        let now = self.now;
        for i in 0..self.p.n {
            if let Some(d) = self.slots[i].daemon.as_mut()
                && d.node.poll_timeout().is_some_and(|t| t <= now)
            {
                d.node.handle_timeout(now);
                self.pump();
            }
        }
        self.check_deadlines();
        true
    }

    pub fn run_until(&mut self, until: Instant) {
        while self.step(until) {
            if self.stats.steps > 3_000_000 {
                self.violate("runaway: more than 3,000,000 steps".into());
                return;
            }
        }
    }

    pub fn run_for(&mut self, d: Duration) {
        let until = self.now + d;
        self.run_until(until);
    }

    /// Run until `pred` holds (checked between steps), at most `max`. Whether it held.
    pub fn run_while_not(&mut self, max: Duration, pred: impl Fn(&World) -> bool) -> bool {
        let until = self.now + max;
        loop {
            if pred(self) {
                return true;
            }
            if !self.step(until) {
                return pred(self);
            }
        }
    }

    /// Every daemon up, READY, and connected to every peer.
    pub fn all_up(&self) -> bool {
        self.slots.iter().all(|s| {
            s.daemon.as_ref().is_some_and(|d| {
                !d.exiting
                    && d.node.state() == DaemonState::Ready
                    && d.node
                        .links()
                        .iter()
                        .all(|l| l.status == ConnStatus::Connected)
            })
        })
    }

    /// [`World::all_up`], and every pair down to one session, the one both sides name. A
    /// session retired by one end is ending (by its retire wait at the latest, which
    /// `owed.rs` checks) and is not counted.
    pub fn settled(&self) -> bool {
        if !self.all_up() {
            return false;
        }
        let n = self.p.n;
        (0..n).all(|a| {
            (a + 1..n).all(|b| {
                let named = |x: usize, y: usize| {
                    self.node(x)
                        .and_then(|m| m.session_of(Self::id(y)))
                        .and_then(|via| self.find(x, y, via))
                };
                let live = |key: (usize, usize)| {
                    self.sessions
                        .get(&key)
                        .is_some_and(|s| !self.retiring(key, *s))
                };
                let count = usize::from(live((a, b))) + usize::from(live((b, a)));
                count == 1 && named(a, b).is_some() && named(a, b) == named(b, a)
            })
        })
    }

    /// The sessions and what each node names, for a violation's message.
    pub fn sessions_seen(&self) -> String {
        let n = self.p.n;
        let named: Vec<String> = (0..n)
            .flat_map(|a| (0..n).filter(move |b| *b != a).map(move |b| (a, b)))
            .map(|(a, b)| {
                let via = self.node(a).and_then(|m| m.session_of(Self::id(b)));
                format!("{a}->{b}: {via:?}")
            })
            .collect();
        format!("sessions {:?}; named {}", self.sessions, named.join(", "))
    }

    /// Deliver driver events to each daemon and perform every action, until quiet.
    pub fn pump(&mut self) {
        let now = self.now;
        loop {
            let mut did = false;
            for i in 0..self.p.n {
                loop {
                    let slot = &mut self.slots[i];
                    let Some(d) = slot.daemon.as_mut() else { break };
                    if slot.driver.session.map(|s| s.instance) != Some(d.instance) {
                        break;
                    }
                    let Some(ev) = slot.driver.events.pop_front() else {
                        break;
                    };
                    d.node.handle_driver_event(now, ev.clone());
                    if let Event::Import { export_node, .. } = &ev
                        && d.node.imports_to(*export_node).1 > 0
                    {
                        self.stats.waited += 1;
                    }
                    self.note(|| format!("node {i}: driver event {ev:?}"));
                    self.drain(i);
                    did = true;
                }
                did |= self.drain(i);
            }
            if !did {
                return;
            }
        }
    }

    fn drain(&mut self, i: usize) -> bool {
        let mut did = false;
        while let Some(action) = self.slots[i]
            .daemon
            .as_mut()
            .and_then(|d| d.node.poll_action())
        {
            did = true;
            self.perform(i, action);
        }
        self.check_gone();
        did
    }
}
