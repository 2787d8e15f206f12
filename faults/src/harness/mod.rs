//! What every scenario shares: the careful clients, what they saw and the
//! one checker, a run's lifecycle (servers up, load on, heal, verdict) and
//! the report it ends in, and the judging helpers scenarios add their own
//! bounds with. Scenarios inject faults; the harness decides nothing about
//! faults, only about what the clients went through.

pub mod history;
pub mod judge;
pub mod report;
pub mod run;
pub mod workload;
