//! The measuring subcommands: `run` (one system, one workload), `compare`
//! (every system, every workload, repeated, with the targets and the files)
//! and `soak` (a long open-loop run watching RSS and errors).
//!
//! * `options`: their command line, and the systems one can name;
//! * `lineup`: starting a system under test and stopping them all;
//! * `run`, `compare` and `soak`: one subcommand each; `matrix` is what
//!   `compare` measures, `environment` the machine it ran on.

mod compare;
mod environment;
mod lineup;
mod matrix;
mod options;
mod placement;
mod run;
mod soak;

pub use compare::compare;
pub use options::{CompareArgs, RunArgs, SoakArgs};
pub use run::run;
pub use soak::soak;
