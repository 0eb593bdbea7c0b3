//! The in-process test layer: whole daemons (`openimex_imexd::run`, the same code as the
//! binary's) run together in one process, on an in-process network ([`MemNet`]), under tokio's
//! paused clock. Time moves only when every daemon waits for a timer, so a 10 s deadline
//! takes microseconds of the test's time and fires at exactly 10 s of virtual time: the
//! lifecycle decisions core takes on timers (docs/DESIGN.md §2) are checked here at their instant,
//! not after a sleep long enough on a quiet machine.
//!
//! The daemons run the `nogpu` driver (control plane only), or a driver whose GPUs' probes
//! and CLIQUE_ID_CHANGE events the test sets (`gpus.rs`): what this layer drives is the
//! peers' lifecycle — formation, the hello deadline, the goodbye wait, SIGUSR1 readdressing —
//! and the fabric view (probe reads on core's timer, cliques told to peers).
//! The import bound is checked here too (`imports.rs`), and so are the two decisions about a
//! pair's old connections, with one connection stalled while the others flow
//! ([`MemNet::stall`]): the retire wait of a session the pair moved off (`retire.rs`), and the
//! late answer to a superseded dial (`late_dial.rs`). Jobs defined by job files (`jobs.rs`):
//! read as they are written and deleted, told to the members, and the imports they admit.

mod cliques;
mod domain;
mod first_round;
mod gpus;
mod imports;
mod jobs;
mod late_dial;
mod lifecycle;
mod retire;
