//! What every listener of the process shares, below the services that use
//! it: bounds on a listener's connections ([`connections`]).

pub mod connections;
