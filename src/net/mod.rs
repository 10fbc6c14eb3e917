//! What every listener of the process shares, below the services that use
//! it: bounds on a listener's connections ([`connections`]) and the decode
//! pool's TLS ([`tls`]).

pub mod connections;
pub mod tls;
